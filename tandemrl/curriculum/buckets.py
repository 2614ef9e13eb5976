"""Difficulty buckets: normalise the rewards, find the valleys of their Gaussian KDE, cut at the emptiest ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Normalize = Literal["minmax", "clip"]


@dataclass
class Bucketing:
    """Boundaries (ascending, in normalised reward units) and how they were found: ``"kde"``, or why there is only
    one bucket."""

    boundaries: list[float]
    method: str

    @property
    def n_buckets(self) -> int:
        return len(self.boundaries) + 1


def normalize(values: np.ndarray, mode: Normalize, reference: np.ndarray | None = None) -> np.ndarray:
    """``minmax``: rescale so that ``reference`` (default: ``values``) spans [0, 1], values outside it clamped (a
    reference of equal values: 0.5 everywhere); ``clip``: clamp to [0, 1]."""
    values = np.asarray(values, dtype=np.float64)
    if mode == "clip":
        return np.clip(values, 0.0, 1.0)
    if mode != "minmax":
        raise ValueError(f"curriculum.normalize must be 'minmax' or 'clip', got {mode!r}")
    scale = values if reference is None else np.asarray(reference, dtype=np.float64)
    if values.size == 0 or scale.size == 0:
        return values
    low, span = scale.min(), np.ptp(scale)
    return np.full_like(values, 0.5) if span == 0 else np.clip((values - low) / span, 0.0, 1.0)


def find_boundaries(normalised: np.ndarray, n_buckets: int, bandwidth: float | str, grid_points: int,
                    min_samples: int, min_bucket_fraction: float = 0.0) -> Bucketing:
    """Up to ``n_buckets - 1`` valleys (strict local minima) of the KDE on a ``grid_points`` grid over [0, 1], the
    lowest-density ones first, sorted. A valley that would leave a bucket with fewer than ``min_bucket_fraction``
    of the samples is passed over (with a narrow bandwidth, a lone tail sample makes a deep valley of its own).
    Too few samples, equal values or no usable valley give one bucket (no boundaries)."""
    values = np.asarray(normalised, dtype=np.float64)
    if n_buckets < 2:
        return Bucketing([], "one bucket configured")
    if values.size < min_samples:
        return Bucketing([], f"too few samples ({values.size} < curriculum.min_samples = {min_samples})")
    if np.ptp(values) == 0:
        return Bucketing([], "all rewards equal")
    from scipy.stats import gaussian_kde  # here, not at the top: scipy.stats costs every process a second to import

    grid = np.linspace(0.0, 1.0, grid_points)
    density = gaussian_kde(values, bw_method=bandwidth)(grid)
    valleys = _valleys(density)
    smallest = max(1, int(np.ceil(min_bucket_fraction * values.size)))
    chosen: list[float] = []
    for i in valleys[np.argsort(density[valleys], kind="stable")]:
        trial = sorted(chosen + [float(grid[i])])
        if np.bincount(assign(values, trial), minlength=len(trial) + 1).min() >= smallest:
            chosen = trial
        if len(chosen) == n_buckets - 1:
            break
    if not chosen:
        return Bucketing([], "no valley in the reward density" if valleys.size == 0 else
                         f"no valley leaves curriculum.min_bucket_fraction = {min_bucket_fraction} on each side")
    return Bucketing(chosen, "kde")


def _valleys(density: np.ndarray) -> np.ndarray:
    """Grid indices of strict local minima. A flat run counts as one point (its middle): across a wide gap
    between two modes the density underflows to exactly 0 over many grid points."""
    starts = np.concatenate([[0], np.flatnonzero(np.diff(density) != 0) + 1])
    ends = np.concatenate([starts[1:], [density.size]])
    levels = density[starts]
    inner = levels[1:-1]
    runs = np.flatnonzero((inner < levels[:-2]) & (inner < levels[2:])) + 1
    return (starts[runs] + ends[runs] - 1) // 2


def assign(normalised: np.ndarray, boundaries: list[float]) -> np.ndarray:
    """Bucket index per value: 0 below the first boundary (the hardest samples: lowest reward), and so on."""
    return np.searchsorted(np.asarray(boundaries, dtype=np.float64), np.asarray(normalised), side="right")
