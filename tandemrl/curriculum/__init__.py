"""Adaptive curriculum: a per-sample reward EMA, KDE difficulty buckets, rollouts per bucket, a report per epoch."""

from tandemrl.curriculum.curriculum import BucketSummary, Curriculum, EpochReport

__all__ = ["BucketSummary", "Curriculum", "EpochReport"]
