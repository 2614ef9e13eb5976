"""Tandem rollouts as the engine runs them: a trained "hot" model and a frozen one write each sequence together.

Whose token is kept where is policy, decided above the engine (tandemrl/tandem/: the selectors); the engine reads
it through each request's owner stream (``OwnerStream``), seeded per request, so rollouts are reproducible. Writers
that do not depend on the tokens (``drawn_ahead``) make tandem bursts (tandem_burst.py); writers that switch at
boundary tokens make a step one segment per row (VERIFY with ``forced``: the frozen run, cut on the host where
``resolve`` says, then the hot model's token). Every kept token carries the hot model's log-prob and its writer
(``Rollout.token_sources``), which the trainer turns into loss weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence as Seq, runtime_checkable

FROZEN = "frozen"  # the runner slot of the frozen model


@runtime_checkable
class OwnerStream(Protocol):
    """A sequence's writers (True = hot), position by position; peeking never moves it (a failed step can be retried).
    A drawn-ahead stream also has ``peek(n)``: the writers of the next n positions."""

    def next_segment(self, limit: int) -> tuple[int, bool]:
        """(r, hot_follows): r leading frozen positions (r <= limit), then maybe one hot one."""
        ...

    def resolve(self, frozen_tokens: Seq[int]) -> tuple[int, bool]:
        """(n, hot_next): how many leading ``frozen_tokens`` stay frozen-owned, and whether position n is hot."""
        ...

    def advance(self, tokens: Seq[int], owners: Seq[bool]) -> None:
        """Consume the kept positions (token ids and writers); ValueError if the writers are not the stream's."""
        ...


@dataclass(frozen=True)
class TandemRollouts:
    """What a tandem engine needs (``max_run_tokens``: frozen tokens a segment step holds at most)."""

    owner_stream: Callable[[str, int | None], OwnerStream]
    drawn_ahead: bool
    max_run_tokens: int
