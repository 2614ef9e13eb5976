"""Speculative decoding's settings and its host-side part: which rows propose how many tokens each step.

Each decode step of a speculative engine is a VERIFY step (step.py): every running sequence proposes up to
``num_tokens`` tokens, the target model checks them in one forward and keeps them up to the first rejection
(rejection.py: the output distribution is the target's). Proposals come from a draft model in the runner's ``draft``
slot (``method = "draft"``; it proposes on the device, inside the launch, for ``rounds`` verify rounds in a row:
model/rounds.py) or from the sequence's own earlier tokens (``method = "ngram"``, prompt lookup, on the host;
ngram.py). Scheduling is synchronous: what a launch kept decides the next one's positions.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Literal

from tandemrl.engine.ngram import NgramIndex
from tandemrl.engine.sequence import Sequence

DRAFT = "draft"  # the runner slot of the draft model


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
    num_tokens: int = field(default=4, metadata={"description": "tokens proposed per sequence per verify round"})
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

    def validate(self) -> None:
        if self.method not in (None, "draft", "ngram"):
            raise ValueError(f"speculative.method must be 'draft', 'ngram' or unset, got {self.method!r}")
        for name in ("num_tokens", "ngram_max", "ngram_min", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative.{name} must be an integer >= 1, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"speculative.ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")


class NgramProposer:
    """Prompt-lookup proposals for the scheduler: one incremental index per sequence (ngram.py), fed the tokens the
    sequence gained since its last proposal; an index goes with its sequence (weak keys)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.ngram_min, config.ngram_max
        self._indexes: weakref.WeakKeyDictionary[Sequence, NgramIndex] = weakref.WeakKeyDictionary()

    def __call__(self, seq: Sequence, k: int) -> list[int]:
        index = self._indexes.get(seq)
        if index is None:
            index = self._indexes[seq] = NgramIndex(self.min_n, self.max_n)
        index.extend(seq.token_ids[len(index):seq.num_known_tokens])
        return index.propose(k)


def ngram_proposer(config: SpeculativeConfig) -> NgramProposer | None:
    """The host-side proposer of ``method = "ngram"``; None for the other methods (the runner's draft proposes)."""
    return NgramProposer(config) if config.method == "ngram" else None
