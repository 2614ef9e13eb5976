"""Tandem rollouts as the engine runs them: a trained "hot" model and a frozen one write each sequence together.

Whose token is kept where is policy, decided above the engine (tandemrl/tandem/: the selectors); the engine reads
it through each request's owner stream (``OwnerStream``), seeded per request, so rollouts are reproducible. Writers
that do not depend on the tokens (``drawn_ahead``) make tandem bursts (tandem_burst.py); writers that switch at
boundary tokens make a step one segment per row (VERIFY with ``forced``: the frozen run, cut on the host where
``resolve`` says, then the hot model's token). Every kept token carries the hot model's log-prob and its writer
(``Rollout.token_sources``), which the trainer turns into loss weights.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence as Seq, runtime_checkable

if TYPE_CHECKING:
    from tandemrl.engine.sequence import Sequence

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


@dataclass
class TandemRow:
    """A sequence's owner stream (None: a request outside tandem) and, per completion token, whether hot wrote it."""

    owners: OwnerStream | None = None
    sources: list[bool] = field(default_factory=list)


class TandemRows:
    """The tandem state of each sequence of a tandem engine, kept beside it (``Sequence`` holds none); weak keys: a
    row goes with its sequence."""

    def __init__(self) -> None:
        self._rows: weakref.WeakKeyDictionary[Sequence, TandemRow] = weakref.WeakKeyDictionary()

    def add(self, seq: Sequence, owners: OwnerStream | None) -> None:
        self._rows[seq] = TandemRow(owners)

    def row(self, seq: Sequence) -> TandemRow:
        """The sequence's row (a new one for a sequence outside tandem)."""
        found = self._rows.get(seq)
        if found is None:
            found = self._rows[seq] = TandemRow()
        return found

    def owners(self, seq: Sequence) -> OwnerStream | None:
        found = self._rows.get(seq)
        return found.owners if found is not None else None

    def sources(self, seq: Sequence) -> list[bool]:
        found = self._rows.get(seq)
        return list(found.sources) if found is not None else []
