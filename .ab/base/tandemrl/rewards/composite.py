"""A weighted sum of reward components that survives failing components and reports what happened."""

from __future__ import annotations

import math
import statistics
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandemrl.rewards.functions import resolve_reward


class RewardComponentError(RuntimeError):
    """A reward component returned something unusable (wrong length, a non-number)."""


@dataclass
class RewardResult:
    total: list[float | None]  # weighted sum per completion; None if any component is None there
    components: dict[str, list[float | None]]  # unweighted values per component
    errors: dict[str, int]  # failed calls (raised or returned something unusable), only components that failed
    first_traceback: str | None
    nonfinite: int  # NaN/inf values turned into None


class CompositeReward:
    """``components``: name -> (fn, weight). Calling it evaluates every component on the batch.

    A component that raises, returns the wrong number of values, or returns a non-number gives None for all its
    samples, counts one error, and (the first time) leaves its traceback in ``first_traceback``. NaN/inf values
    become None and are counted in ``nonfinite``.
    """

    def __init__(self, components: dict[str, tuple[Callable[..., Any], float]]) -> None:
        if not components:
            raise ValueError("a composite reward needs at least one component")
        for name, (fn, weight) in components.items():
            if not callable(fn):
                raise ValueError(f"reward component {name!r} is not callable: {fn!r}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ValueError(f"reward component {name!r} needs a finite numeric weight, got {weight!r}")
        self.components = {name: (fn, float(weight)) for name, (fn, weight) in components.items()}

    @property
    def names(self) -> list[str]:
        return list(self.components)

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list[Any]] | None = None
    ) -> RewardResult:
        columns = dict(columns or {})
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        for key, column in columns.items():
            if key in ("prompts", "completions"):
                raise ValueError(f"column name {key!r} is reserved for the reward function arguments")
            if len(column) != n:
                raise ValueError(f"column {key!r} has {len(column)} values for {n} completions")
        values: dict[str, list[float | None]] = {}
        errors: dict[str, int] = {}
        first_traceback: str | None = None
        nonfinite = 0
        for name, (fn, _) in self.components.items():
            try:
                # fresh lists per component: one component mutating its inputs cannot affect the next
                raw = fn(list(prompts), list(completions), **{k: list(v) for k, v in columns.items()})
                values[name], bad = _check_values(name, raw, n)
                nonfinite += bad
            except Exception:
                values[name] = [None] * n
                errors[name] = errors.get(name, 0) + 1
                if first_traceback is None:
                    first_traceback = f"reward component {name!r} failed:\n{traceback.format_exc()}"
        total: list[float | None] = []
        for i in range(n):
            parts = [values[name][i] for name in self.components]
            if any(v is None for v in parts):
                total.append(None)
            else:
                total.append(sum(w * v for (_, w), v in zip(self.components.values(), parts)))
        return RewardResult(total, values, errors, first_traceback, nonfinite)

    @staticmethod
    def metrics(result: RewardResult) -> dict[str, float]:
        """Same as the module-level :func:`metrics`."""
        return metrics(result)


def _check_values(name: str, raw: Any, n: int) -> tuple[list[float | None], int]:
    if raw is None or isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
        raise RewardComponentError(f"reward {name!r} returned {type(raw).__name__}, expected a list of {n} floats")
    raw = list(raw)
    if len(raw) != n:
        raise RewardComponentError(f"reward {name!r} returned {len(raw)} values for {n} completions")
    out: list[float | None] = []
    nonfinite = 0
    for i, v in enumerate(raw):
        if v is None:
            out.append(None)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise RewardComponentError(f"reward {name!r} returned a non-number at index {i}: {v!r}") from None
        if math.isfinite(f):
            out.append(f)
        else:
            out.append(None)
            nonfinite += 1
    return out, nonfinite


def _mean_std(values: list[float | None]) -> tuple[float, float]:
    xs = [v for v in values if v is not None]
    if not xs:
        return 0.0, 0.0
    return statistics.fmean(xs), statistics.pstdev(xs)  # pstdev is exact: equal values give 0.0


def metrics(result: RewardResult) -> dict[str, float]:
    """reward/mean and reward/std over non-None totals (population std; 0.0 when there are none),
    reward/<name>/mean per component, reward/errors (failed component calls), reward/nonfinite."""
    mean, std = _mean_std(result.total)
    out = {"reward/mean": mean, "reward/std": std}
    for name, vals in result.components.items():
        out[f"reward/{name}/mean"] = _mean_std(vals)[0]
    out["reward/errors"] = float(sum(result.errors.values()))
    out["reward/nonfinite"] = float(result.nonfinite)
    return out


def build_reward(spec: dict[str, float]) -> CompositeReward:
    """A CompositeReward from name -> weight; names are registered rewards or ``package.module:function``.
    A ``module:function`` component is named after its function (the full string if that name is taken)."""
    if not spec:
        raise ValueError("reward weights are empty; give at least one, e.g. {'accuracy': 1.0}")
    components: dict[str, tuple[Callable[..., Any], float]] = {}
    for key, weight in spec.items():
        fn = resolve_reward(key)
        name = key.rpartition(":")[2].rpartition(".")[2] if ":" in key else key
        if name in components or name in spec and name != key:
            name = key
        components[name] = (fn, weight)
    return CompositeReward(components)
