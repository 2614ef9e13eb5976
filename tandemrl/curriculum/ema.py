"""Per-sample exponential moving average of the reward, updated once per epoch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class RewardEMA:
    """``ema = decay * ema + (1 - decay) * epoch_mean`` per sample; a sample's first epoch mean is taken as is.

    During an epoch :meth:`record` sums each sample's rewards (None, a failed reward, is skipped); :meth:`end_epoch`
    folds the epoch's means in. A sample never seen has the EMA ``unseen``.
    """

    def __init__(self, decay: float, unseen: float = 0.5) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"curriculum.ema_decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.unseen = unseen
        self.values: dict[int, float] = {}
        self._sums: dict[int, float] = {}  # this epoch, so far
        self._counts: dict[int, int] = {}

    def record(self, sample_ids: Sequence[int], rewards: Sequence[float | None]) -> None:
        if len(sample_ids) != len(rewards):
            raise ValueError(f"{len(sample_ids)} sample ids for {len(rewards)} rewards")
        for sample_id, reward in zip(sample_ids, rewards):
            if reward is None:
                continue
            self._sums[sample_id] = self._sums.get(sample_id, 0.0) + float(reward)
            self._counts[sample_id] = self._counts.get(sample_id, 0) + 1

    def end_epoch(self) -> int:
        """Fold this epoch's means into the EMA; returns how many samples had a reward this epoch."""
        for sample_id, total in self._sums.items():
            mean = total / self._counts[sample_id]
            old = self.values.get(sample_id)
            self.values[sample_id] = mean if old is None else self.decay * old + (1.0 - self.decay) * mean
        seen = len(self._sums)
        self._sums, self._counts = {}, {}
        return seen

    def value(self, sample_id: int) -> float:
        return self.values.get(sample_id, self.unseen)

    def array(self, sample_ids: Iterable[int]) -> list[float]:
        return [self.value(i) for i in sample_ids]

    def state_dict(self) -> dict[str, Any]:
        # lists, not int-keyed dicts: the checkpoint's JSON would turn the keys into strings
        return {
            "decay": self.decay, "unseen": self.unseen,
            "ids": list(self.values), "values": list(self.values.values()),
            "pending_ids": list(self._sums), "pending_sums": list(self._sums.values()),
            "pending_counts": [self._counts[i] for i in self._sums],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("decay", "unseen"):
            if state[key] != getattr(self, key):
                raise ValueError(f"cannot resume the curriculum: saved {key} {state[key]!r}, configured "
                                 f"{getattr(self, key)!r} (curriculum.{'ema_decay' if key == 'decay' else 'unseen_reward'})")
        self.values = {int(i): float(v) for i, v in zip(state["ids"], state["values"], strict=True)}
        self._sums = {int(i): float(v) for i, v in zip(state["pending_ids"], state["pending_sums"], strict=True)}
        self._counts = {int(i): int(c) for i, c in zip(state["pending_ids"], state["pending_counts"], strict=True)}
