"""A weighted sum of reward components that survives failing components and reports what happened."""

from __future__ import annotations

import asyncio
import inspect
import math
import statistics
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandemrl.rewards.functions import resolve_reward
from tandemrl.rewards.names import component_names, find_reward
from tandemrl.rewards.state import RewardTrainerState

TRAINER_STATE = "trainer_state"  # the keyword TRL passes where training stands


class RewardComponentError(RuntimeError):
    """A reward component returned something unusable (wrong length, a non-number)."""


@dataclass
class RewardResult:
    total: list[float | None]  # weighted sum per completion; None if any component is None there
    components: dict[str, list[float | None]]  # unweighted values per component
    errors: dict[str, int]  # failed calls (raised or returned something unusable), only components that failed
    first_traceback: str | None
    nonfinite: int  # NaN/inf values turned into None
    nonfinite_by: dict[str, int] = field(default_factory=dict)  # the same per component, only those that had any

    def invalid_components(self) -> list[str]:
        """Components that gave no usable value for any sample (raised, NaN/inf, None), in order."""
        return [name for name, vals in self.components.items() if all(v is None for v in vals)]


# Rewards beyond float32's range would overflow the advantages (computed in float32): such a value is handled like
# NaN (the sample is left out of the update), not summed into an infinity or an OverflowError.
MAX_REWARD_MAGNITUDE = 3.0e38


class CompositeReward:
    """``components``: name -> (fn, weight). Calling it evaluates every component on the batch.

    Each function is called as TRL calls reward functions: by keyword, ``fn(prompts=..., completions=...,
    completion_ids=..., trainer_state=..., **columns)``; ``trainer_state`` (when the caller gives one) only reaches
    a function that takes ``**kwargs`` or a ``trainer_state`` parameter, so one written before it existed, naming
    its columns without ``**kwargs``, still works. An ``async def`` function is awaited (all of them
    concurrently). A ``None`` value means that function abstains for that sample: its term is left out of that
    sample's sum, as in TRL. A sample where every function abstains has no reward (None, left out of the update).

    A component that raises, returns the wrong number of values, or returns a non-number gives None for all its
    samples, counts one error, and (the first time) leaves its traceback in ``first_traceback``; those samples have
    no reward. NaN, infinite or overflowing values (beyond +-3e38) are counted in ``nonfinite`` and leave that
    sample without a reward.
    """

    def __init__(self, components: dict[str, tuple[Callable[..., Any], float]],
                 specs: Mapping[str, str] | None = None) -> None:
        """``specs``: component name -> what the user wrote for it (``rewards.py:correct``), for the names that
        ``eval.metric`` accepts; default: the component names themselves."""
        if not components:
            raise ValueError("a composite reward needs at least one component")
        for name, (fn, weight) in components.items():
            if not callable(fn):
                raise ValueError(f"reward component {name!r} is not callable: {fn!r}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ValueError(f"reward component {name!r} needs a finite numeric weight, got {weight!r}")
        self.components = {name: (fn, float(weight)) for name, (fn, weight) in components.items()}
        self.specs = {name: (specs or {}).get(name, name) for name in components}
        self._takes_state = {name: _accepts_keyword(fn, TRAINER_STATE) for name, (fn, _) in components.items()}

    @property
    def names(self) -> list[str]:
        return list(self.components)

    def find(self, name: str, what: str) -> str | None:
        """The component ``name`` means: a component name, a spec as written, or a short name only one spec has
        (a shared one raises, naming both); None when it names none. ``what`` starts the error (``eval.metric``)."""
        if name in self.components:
            return name
        spec = find_reward(name, list(self.specs.values()), what)
        return next((n for n, s in self.specs.items() if s == spec), None) if spec is not None else None

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list[Any]] | None = None,
                 completion_ids: Sequence[list[int]] | None = None,
                 trainer_state: RewardTrainerState | None = None) -> RewardResult:
        """``trainer_state``: where training stands (TRL's ``trainer_state`` keyword); None: not passed."""
        n = len(completions)
        arguments = _arguments(prompts, completions, columns or {}, completion_ids)
        state = {TRAINER_STATE: trainer_state} if trainer_state is not None else {}
        functions = {name: fn for name, (fn, _) in self.components.items()}
        outcomes = _call_all(functions, arguments, {name: state for name in functions if self._takes_state[name]})
        values: dict[str, list[float | None]] = {}
        errors: dict[str, int] = {}
        first_traceback: str | None = None
        nonfinite_by: dict[str, int] = {}
        broken = [False] * n  # samples a component failed on (raised, NaN, overflow): they get no reward
        for name, outcome in outcomes.items():
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                values[name], bad = _check_values(name, outcome, n)
            except Exception as err:  # noqa: BLE001 - a failing user function must not stop the run
                values[name], bad = [None] * n, []
                errors[name] = errors.get(name, 0) + 1
                broken = [True] * n
                if first_traceback is None:
                    trace = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                    first_traceback = f"reward component {name!r} failed:\n{trace}"
            for i in bad:
                broken[i] = True
            if bad:
                nonfinite_by[name] = len(bad)
        total = [None if broken[i] else self._weighted_sum(values, i) for i in range(n)]
        overflowed = sum(1 for i, t in enumerate(total) if t is not None and not _usable(t))
        total = [t if t is not None and _usable(t) else None for t in total]
        if overflowed:
            nonfinite_by["total"] = overflowed
        return RewardResult(total, values, errors, first_traceback, sum(nonfinite_by.values()), nonfinite_by)

    def _weighted_sum(self, values: dict[str, list[float | None]], i: int) -> float | None:
        """The weighted sum of the terms that did not abstain; None when all abstained."""
        terms = [(w, values[name][i]) for name, (_, w) in self.components.items() if values[name][i] is not None]
        return sum(w * v for w, v in terms) if terms else None

    @staticmethod
    def metrics(result: RewardResult) -> dict[str, float]:
        """Same as the module-level :func:`metrics`."""
        return metrics(result)


def _arguments(prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list[Any]],
               completion_ids: Sequence[list[int]] | None) -> dict[str, Any]:
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions")
    if completion_ids is not None and len(completion_ids) != n:
        raise ValueError(f"{len(completion_ids)} completion_ids for {n} completions")
    for key, column in columns.items():
        if key in ("prompts", "completions", "completion_ids", TRAINER_STATE):
            raise ValueError(f"column name {key!r} is reserved for the reward function arguments")
        if len(column) != n:
            raise ValueError(f"column {key!r} has {len(column)} values for {n} completions")
    ids = [list(c) for c in completion_ids] if completion_ids is not None else [[] for _ in range(n)]
    return {"prompts": list(prompts), "completions": list(completions), "completion_ids": ids, **columns}


def _accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` can be called with ``keyword=``: it has ``**kwargs`` or a parameter of that name (a callable
    whose signature Python cannot read is assumed to, as TRL assumes of every reward function)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD or (p.name == keyword and p.kind is not p.POSITIONAL_ONLY) for p in parameters)


def _call_all(functions: dict[str, Callable[..., Any]], arguments: dict[str, Any],
              extras: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Each function's return value, or the exception it raised. Every call gets fresh lists, so that a function
    mutating its inputs cannot affect the next; async functions run concurrently on one event loop. ``extras``:
    per function, keywords passed as they are (the frozen trainer state)."""
    def fresh() -> dict[str, Any]:
        return {k: list(v) for k, v in arguments.items()}

    outcomes: dict[str, Any] = {}
    pending: dict[str, Any] = {}
    for name, fn in functions.items():
        try:
            result = fn(**fresh(), **extras.get(name, {}))
        except Exception as err:  # noqa: BLE001
            result = err
        if inspect.isawaitable(result):
            pending[name] = result
        outcomes[name] = result
    if pending:
        async def gather() -> list[Any]:
            return await asyncio.gather(*pending.values(), return_exceptions=True)

        outcomes.update(zip(pending, asyncio.run(gather())))
    return outcomes


def _usable(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= MAX_REWARD_MAGNITUDE


def _check_values(name: str, raw: Any, n: int) -> tuple[list[float | None], list[int]]:
    """The values as floats (None kept: abstention) and the indices of unusable ones (NaN, inf, overflow)."""
    if raw is None or isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
        raise RewardComponentError(f"reward {name!r} returned {type(raw).__name__}, expected a list of {n} floats")
    raw = list(raw)
    if len(raw) != n:
        raise RewardComponentError(f"reward {name!r} returned {len(raw)} values for {n} completions")
    out: list[float | None] = []
    bad: list[int] = []
    for i, v in enumerate(raw):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool):
            v = float(v)
        try:
            f = float(v)
        except (TypeError, ValueError, OverflowError) as err:
            if isinstance(err, OverflowError):  # an int too large for a float
                out.append(None)
                bad.append(i)
                continue
            raise RewardComponentError(f"reward {name!r} returned a non-number at index {i}: {v!r}") from None
        if _usable(f):
            out.append(f)
        else:
            out.append(None)
            bad.append(i)
    return out, bad


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


def build_reward(spec: Mapping[str | Callable[..., Any], float],
                 functions: Mapping[str, Callable[..., Any]] | None = None) -> CompositeReward:
    """A CompositeReward from reward -> weight. A reward is a registered name, ``package.module:function``,
    ``path/to/file.py:function`` or a callable; ``functions`` maps a name to the callable it stands for (the
    Python API's, recorded as ``inline:<name>``). A reward is named after its function (``reward/<name>/mean``);
    where two share that name, each is named by its full spec (see ``rewards.names``)."""
    if not spec:
        raise ValueError("no reward function: give at least one, e.g. {'accuracy': 1.0}")
    labels = [key if isinstance(key, str) else getattr(key, "__name__", type(key).__name__) for key in spec]
    components: dict[str, tuple[Callable[..., Any], float]] = {}
    specs: dict[str, str] = {}
    for (key, weight), label, name in zip(spec.items(), labels, component_names(labels)):
        fn = (functions or {}).get(key) if isinstance(key, str) else None
        if name in components:  # two callables of one __name__ (two lambdas)
            name = f"{name}_{len(components)}"
        components[name] = (fn if fn is not None else resolve_reward(key), weight)
        specs[name] = label
    return CompositeReward(components, specs)
