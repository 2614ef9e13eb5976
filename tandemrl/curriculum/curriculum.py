"""The adaptive curriculum: rewards in during an epoch, buckets and rollouts per prompt out after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tandemrl.config import CurriculumConfig
from tandemrl.curriculum.allocation import bucket_labels, rollouts_for_bucket
from tandemrl.curriculum.buckets import assign, find_boundaries, normalize
from tandemrl.curriculum.ema import RewardEMA


@dataclass
class BucketSummary:
    label: str
    n: int
    percent: float
    mean_reward: float  # mean normalised EMA of its samples: what the allocation reads
    mean_ema: float  # the same before normalisation
    rollouts: int


@dataclass
class EpochReport:
    epoch: int  # 1-based: the report written after the epoch-th pass over the train set
    samples_seen: int  # samples with a reward this epoch
    global_stats: dict[str, float]  # over the EMAs of samples with a reward so far; `unseen`: the others
    normalize: str
    boundaries: list[float]
    method: str
    buckets: list[BucketSummary]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"curriculum/epoch": self.epoch, "curriculum/buckets": len(self.buckets),
                                 "curriculum/ema_mean": self.global_stats["mean"]}
        for bucket in self.buckets:
            out[f"curriculum/{bucket.label}/fraction"] = bucket.percent / 100
            out[f"curriculum/{bucket.label}/rollouts"] = bucket.rollouts
        return out


class Curriculum:
    """Rollouts per prompt from its difficulty bucket. Until the first epoch ends every prompt gets
    ``default_rollouts`` (rollout.group_size); after each epoch, :meth:`end_epoch` re-buckets every train sample."""

    def __init__(self, cfg: CurriculumConfig, sample_ids: Sequence[int], default_rollouts: int) -> None:
        if len(set(sample_ids)) != len(sample_ids):
            raise ValueError("curriculum: the train samples' indices are not unique")
        self.cfg = cfg
        self.sample_ids = list(sample_ids)
        self.default_rollouts = default_rollouts
        self.ema = RewardEMA(cfg.ema_decay, cfg.unseen_reward)
        self.boundaries: list[float] = []
        self.bucket_rollouts: list[int] = []
        self._rollouts: dict[int, int] = {}  # sample id -> rollouts, from the last bucketing

    def rollouts_for(self, sample_id: int) -> int:
        return self._rollouts.get(sample_id, self.default_rollouts)

    def record(self, sample_ids: Sequence[int], rewards: Sequence[float | None]) -> None:
        self.ema.record(sample_ids, rewards)

    def end_epoch(self, epoch: int) -> EpochReport:
        seen = self.ema.end_epoch()
        raw = np.asarray(self.ema.array(self.sample_ids), dtype=np.float64)
        # The scale and the valleys come from samples with rewards: a never-drawn sample's `unseen_reward` (0.5)
        # would otherwise stretch minmax over rewards that all lie near 0 and make every seen prompt look hard.
        # Such a sample sits at `unseen_reward` on the normalised scale (0.5: the middle), as under `clip`.
        rated = np.asarray([i in self.ema.values for i in self.sample_ids], dtype=bool)
        rated = rated if rated.any() else np.ones_like(rated)
        normalised = normalize(raw, self.cfg.normalize, reference=raw[rated])
        normalised[~rated] = min(max(self.cfg.unseen_reward, 0.0), 1.0)
        cut = find_boundaries(normalised[rated], self.cfg.n_buckets, self.cfg.bandwidth, self.cfg.grid_points,
                              self.cfg.min_samples, self.cfg.min_bucket_fraction)
        index = assign(normalised, cut.boundaries)
        buckets = []
        for b, label in enumerate(bucket_labels(cut.n_buckets)):
            members = index == b
            mean = float(normalised[members].mean()) if members.any() else 0.0
            buckets.append(BucketSummary(label, int(members.sum()), 100.0 * float(members.mean()), mean,
                                         float(raw[members].mean()) if members.any() else 0.0,
                                         rollouts_for_bucket(mean, self.cfg.base_rollouts, self.cfg.alpha)))
        self.boundaries = cut.boundaries
        self.bucket_rollouts = [b.rollouts for b in buckets]
        self._rollouts = {i: self.bucket_rollouts[b] for i, b in zip(self.sample_ids, index.tolist())}
        rated_raw = raw[rated]
        stats = {"n": float(rated_raw.size), "unseen": float(raw.size - rated_raw.size),
                 "mean": float(rated_raw.mean()), "std": float(rated_raw.std()), "min": float(rated_raw.min()),
                 "max": float(rated_raw.max())}
        return EpochReport(epoch, seen, stats, self.cfg.normalize, cut.boundaries, cut.method, buckets)

    def state_dict(self) -> dict[str, Any]:
        return {
            "ema": self.ema.state_dict(), "boundaries": list(self.boundaries),
            "bucket_rollouts": list(self.bucket_rollouts),
            "rollout_ids": list(self._rollouts), "rollouts": list(self._rollouts.values()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in ("ema", "boundaries", "bucket_rollouts", "rollout_ids", "rollouts") if k not in state]
        if missing:
            raise ValueError(f"invalid curriculum state: missing {', '.join(missing)}")
        unknown = set(state["rollout_ids"]) - set(self.sample_ids)
        if unknown:
            raise ValueError(f"cannot resume the curriculum: {len(unknown)} saved sample ids are not in the train set "
                             "(resume with the same data)")
        self.ema.load_state_dict(state["ema"])
        self.boundaries = [float(b) for b in state["boundaries"]]
        self.bucket_rollouts = [int(r) for r in state["bucket_rollouts"]]
        self._rollouts = {int(i): int(r) for i, r in zip(state["rollout_ids"], state["rollouts"], strict=True)}
