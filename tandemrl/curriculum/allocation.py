"""How many rollouts a bucket's prompts get: harder buckets (lower normalised reward) get more."""

from __future__ import annotations


def rollouts_for_bucket(normalised_mean_reward: float, base: int, alpha: float) -> int:
    """``max(1, round(base * (1 + alpha * (1 - normalised_mean_reward))))``, with Python's ``round`` (halves to
    even, as the seed computes it). E.g. base 4, alpha 1.5: mean 0 -> 10, 0.5 -> 7, 1 -> 4."""
    if base < 1:
        raise ValueError(f"curriculum.base_rollouts must be >= 1, got {base}")
    return max(1, round(base * (1.0 + alpha * (1.0 - normalised_mean_reward))))


def bucket_labels(n_buckets: int) -> list[str]:
    """Names from the lowest-reward bucket up: hard .. easy."""
    if n_buckets == 1:
        return ["all"]
    if n_buckets == 2:
        return ["hard", "easy"]
    if n_buckets == 3:
        return ["hard", "medium", "easy"]
    return ["hard", *[f"medium-{i}" for i in range(1, n_buckets - 1)], "easy"]
