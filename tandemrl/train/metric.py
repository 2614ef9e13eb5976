"""eval.metric: the one number that the summary, the progress line, best-checkpoint selection and early stopping
use: the built-in accuracy, the weighted reward total, or one reward function's mean."""

from __future__ import annotations

from tandemrl.rewards.composite import CompositeReward


def metric_value(metric: str, accuracy: float | None, reward: float | None,
                 components: dict[str, float | None]) -> float:
    """The value of ``metric``; one that no test sample gave a value for raises (it is never read as 0)."""
    if metric == "accuracy":
        if accuracy is None:
            raise ValueError("eval.metric = 'accuracy' needs an 'answer' column in the data")
        return accuracy
    value = reward if metric == "reward" else components[metric]
    if value is None:
        raise ValueError(f"eval.metric = {metric!r} has no value: no test sample got a usable one")
    return value


def resolve_metric(metric: str | None, reward: CompositeReward, has_answer: bool) -> str:
    """eval.metric, checked, as the name its metrics are logged under (``correct`` for ``rewards.py:correct``,
    which is accepted too); unset: ``accuracy`` where the data has an ``answer`` column, else ``reward``. A short
    name two reward functions share raises, naming both."""
    names = ", ".join(reward.names)
    if metric is None:
        return "accuracy" if has_answer else "reward"
    if metric == "accuracy" and not has_answer:
        raise ValueError("eval.metric = 'accuracy' needs an 'answer' column in the data; use 'reward' or one of the "
                         f"reward functions: {names}")
    if metric in ("accuracy", "reward"):
        return metric
    found = reward.find(metric, "eval.metric")
    if found is None:
        raise ValueError(f"eval.metric = {metric!r} is not 'accuracy', 'reward' or a reward function of this run "
                         f"({names})")
    return found
