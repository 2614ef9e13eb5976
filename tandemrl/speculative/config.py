"""The speculative section of the config, and the engine's speculative contract built from it
(``SpeculativeConfig.for_engine``). How the engine verifies proposals: docs/speculative.md and engine/speculative.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tandemrl.engine.speculative import Speculation
from tandemrl.speculative.ngram import NgramProposer


@dataclass
class SpeculativeConfig:
    """``method``: None (off), "draft" or "ngram"; ``num_tokens``: proposals per sequence per step; ``draft_model``:
    the draft's hub id or local directory (method "draft"; loaded by the trainer's setup, which must share the
    target's vocabulary); ``ngram_max``/``ngram_min``: the n-gram lengths prompt lookup tries, longest first;
    ``rounds``: verify rounds per launch (method "draft", model/rounds.py)."""

    __pydantic_config__ = {"extra": "forbid"}

    method: Literal["draft", "ngram"] | None = field(default=None, metadata={
        "description": "unset: off; `draft`: a draft model proposes; `ngram`: prompt lookup in the sequence's own "
                       "earlier tokens (no second model)"})
    num_tokens: int = field(default=4, metadata={"description": "tokens proposed per sequence per verify round, at least 1"})
    draft_model: str | None = field(default=None, metadata={
        "description": "`draft`: the draft's hub id or local directory (`\"tiny\"`: the offline model); it must "
                       "share the target's vocabulary"})
    ngram_max: int = field(default=3, metadata={"description": "`ngram`: the longest n-gram looked up"})
    ngram_min: int = field(default=1, metadata={"description": "`ngram`: the shortest n-gram looked up"})
    rounds: int = field(default=16, metadata={
        "description": "`draft`: verify rounds the device runs back to back per launch (the host reads back, "
                       "postprocesses and schedules once per launch); a sequence that ends inside a launch wastes "
                       "its later rounds. 16 against 8: 0-16 % (median 3 %) less time per token at batch 8 on an "
                       "H100 (bench/RESULTS.md)"})

    @property
    def enabled(self) -> bool:
        return self.method is not None

    def for_engine(self) -> Speculation | None:
        """What the engine needs (validated); None when off. ``ngram``: prompt lookup on the host (ngram.py);
        ``draft``: the runner's draft slot proposes on the device, ``rounds`` rounds a launch."""
        self.validate()
        if self.method is None:
            return None
        if self.method == "ngram":
            return Speculation(self.num_tokens, propose=NgramProposer(self.ngram_min, self.ngram_max))
        return Speculation(self.num_tokens, rounds=self.rounds)

    def validate(self) -> None:
        if self.method not in (None, "draft", "ngram"):
            raise ValueError(f"speculative.method must be 'draft', 'ngram' or unset, got {self.method!r}")
        for name in ("num_tokens", "ngram_max", "ngram_min", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative.{name} must be an integer >= 1, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"speculative.ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")
