"""eval.metric: the one number that the summary, the progress line, best-checkpoint selection and early stopping
use: the built-in accuracy, the weighted reward total, or one reward function's mean."""

from __future__ import annotations


def metric_value(metric: str, accuracy: float | None, reward: float, components: dict[str, float]) -> float:
    if metric == "accuracy":
        if accuracy is None:
            raise ValueError("eval.metric = 'accuracy' needs an 'answer' column in the data")
        return accuracy
    return reward if metric == "reward" else components[metric]


def resolve_metric(metric: str | None, reward_names: list[str], has_answer: bool) -> str:
    """eval.metric, checked; unset: ``accuracy`` where the data has an ``answer`` column, else ``reward``."""
    if metric is None:
        return "accuracy" if has_answer else "reward"
    if metric == "accuracy" and not has_answer:
        raise ValueError("eval.metric = 'accuracy' needs an 'answer' column in the data; use 'reward' or one of the "
                         f"reward functions: {', '.join(reward_names)}")
    if metric not in ("accuracy", "reward", *reward_names):
        raise ValueError(f"eval.metric = {metric!r} is not 'accuracy', 'reward' or a reward function of this run "
                         f"({', '.join(reward_names)})")
    return metric
