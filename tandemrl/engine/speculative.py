"""Speculative decoding's settings and its host-side part: which rows propose how many tokens each step.

Each decode step of a speculative engine is a VERIFY step (step.py): every running sequence proposes up to
``num_tokens`` tokens, the target model checks them in one forward and keeps them up to the first rejection
(rejection.py: the output distribution is the target's). Proposals come from a draft model in the runner's ``draft``
slot (``method = "draft"``; it proposes on the device, inside the launch) or from the sequence's own earlier tokens
(``method = "ngram"``, prompt lookup, on the host; ngram.py). Scheduling is synchronous: what a step kept decides the
next step's positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

DRAFT = "draft"  # the runner slot of the draft model


@dataclass
class SpeculativeConfig:
    """``method``: None (off), "draft" or "ngram"; ``num_tokens``: proposals per sequence per step; ``draft_model``:
    the draft's hub id or local directory (method "draft"; loaded by the trainer's setup, which must share the
    target's vocabulary); ``ngram_max``/``ngram_min``: the n-gram lengths prompt lookup tries, longest first."""

    __pydantic_config__ = {"extra": "forbid"}

    method: Literal["draft", "ngram"] | None = None
    num_tokens: int = 4
    draft_model: str | None = None
    ngram_max: int = 3
    ngram_min: int = 1

    @property
    def enabled(self) -> bool:
        return self.method is not None

    def validate(self) -> None:
        if self.method not in (None, "draft", "ngram"):
            raise ValueError(f"speculative.method must be 'draft', 'ngram' or unset, got {self.method!r}")
        for name in ("num_tokens", "ngram_max", "ngram_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative.{name} must be an integer >= 1, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"speculative.ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")


def ngram_proposer(config: SpeculativeConfig) -> Callable[[Sequence[int], int], list[int]] | None:
    """(a sequence's known tokens, at most k) -> prompt-lookup proposals, for ``method = "ngram"``; else None."""
    if config.method != "ngram":
        return None
    from tandemrl.engine.ngram import NgramConfig, propose_ngram

    def propose(token_ids: Sequence[int], k: int) -> list[int]:
        return propose_ngram(token_ids, NgramConfig(config.ngram_min, config.ngram_max, k))

    return propose
