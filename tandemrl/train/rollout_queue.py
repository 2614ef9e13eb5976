"""The bounded queue between rollout producers (the rollout worker, environments) and the trainer.

Producers put finished, scored groups tagged with the policy version of their oldest token (``oldest_version``:
weights may change while a rollout runs); the trainer takes them in order and leaves out (and counts) those more than
``max_staleness`` versions behind its own. A producer that dies
puts its error instead, and the trainer's next take raises it: the run stops with the producer's message.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.train.scored_groups import group_count


class RolloutProducerError(RuntimeError):
    """A rollout producer died; the message says which and why."""


def oldest_version(scored: ScoredRollouts) -> int:
    """The policy version of the oldest token among the rollouts: a group is as stale as its oldest token."""
    return min(min([r.policy_version, *(version for _, version in r.version_runs)]) for r in scored.rollouts)


@dataclass
class QueuedGroups:
    scored: ScoredRollouts
    version: int  # oldest_version(scored)
    source: str = "worker"  # who produced it (the worker, or an environment's name)
    sample_s: float = 0.0  # how long sampling and scoring it took, where the producer knows (the worker)
    groups: int = field(init=False)

    def __post_init__(self) -> None:
        self.groups = group_count(self.scored)


@dataclass
class Taken:
    """What one take returned, and what it left out."""

    parts: list[QueuedGroups]
    dropped_groups: int
    waited_s: float


class RolloutQueue:
    """Thread-safe FIFO of :class:`QueuedGroups`, at most ``capacity_groups`` groups (``put`` blocks beyond)."""

    def __init__(self, capacity_groups: int) -> None:
        if capacity_groups < 1:
            raise ValueError(f"capacity_groups must be >= 1, got {capacity_groups}")
        self.capacity_groups = capacity_groups
        self._items: collections.deque[QueuedGroups] = collections.deque()
        self._groups = 0
        self._error: str | None = None
        self._closed = False
        self._cond = threading.Condition()

    @property
    def depth_groups(self) -> int:
        with self._cond:
            return self._groups

    def put(self, item: QueuedGroups, timeout: float | None = None) -> bool:
        """Append ``item``, waiting while the queue is full (an item larger than the capacity waits for an empty
        queue); False if ``timeout`` passed or the queue was closed first."""
        with self._cond:
            fits = lambda: self._closed or self._groups == 0 or self._groups + item.groups <= self.capacity_groups
            if not self._cond.wait_for(fits, timeout):
                return False
            if self._closed:
                return False
            self._items.append(item)
            self._groups += item.groups
            self._cond.notify_all()
            return True

    def fail(self, message: str) -> None:
        """A producer died: the next take raises :class:`RolloutProducerError` with ``message``."""
        with self._cond:
            self._error = self._error or message
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, groups: int, trainer_version: int, max_staleness: int, timeout: float | None = None,
             on_drop: Callable[[QueuedGroups], None] | None = None,
             alive: Callable[[], str | None] | None = None) -> Taken:
        """At least ``groups`` groups sampled at most ``max_staleness`` versions behind ``trainer_version``, in
        queue order (whole items: a producer's batch is never split); older items are dropped, counted and handed
        to ``on_drop`` (e.g. to ask for a replacement). Waits for producers; raises :class:`RolloutProducerError`
        if one failed or ``alive`` (checked every second while waiting) names one that ended, TimeoutError after
        ``timeout`` seconds (what was taken goes back to the queue)."""
        started, taken, have, dropped = time.perf_counter(), [], 0, 0
        deadline = None if timeout is None else started + timeout
        with self._cond:
            while have < groups:
                while not self._items:
                    gone = alive() if alive is not None else None
                    if self._error is not None or gone is not None:
                        raise RolloutProducerError(self._error or gone)
                    left = None if deadline is None else deadline - time.perf_counter()
                    if left is not None and left <= 0:
                        self._give_back(taken)
                        raise TimeoutError(f"no rollouts arrived in {timeout:.0f} s ({have} of {groups} groups)")
                    self._cond.wait(1.0 if left is None else min(left, 1.0))
                item = self._items.popleft()
                self._groups -= item.groups
                self._cond.notify_all()  # room for a waiting producer
                if trainer_version - item.version > max_staleness:
                    dropped += item.groups
                    if on_drop is not None:
                        on_drop(item)
                    continue
                taken.append(item)
                have += item.groups
        return Taken(taken, dropped, time.perf_counter() - started)

    def _give_back(self, items: list[QueuedGroups]) -> None:
        for item in reversed(items):
            self._items.appendleft(item)
            self._groups += item.groups
