"""eval.metric: one reward function's name means one function, as the metrics show it or as reward.functions has it."""

import pytest

from tandemrl.rewards.composite import build_reward
from tandemrl.train.metric import metric_value, resolve_metric


def score(completions, **kwargs):
    return [1.0] * len(completions)


def reward_of(*specs: str):
    """The run's reward for ``specs`` (the functions given, as the Python API gives callables)."""
    return build_reward({spec: 1.0 for spec in specs}, {spec: score for spec in specs})


def test_the_short_name_and_the_full_name_mean_the_same_function():
    reward = reward_of("rewards.py:correct", "format")
    assert resolve_metric("correct", reward, has_answer=True) == "correct"
    assert resolve_metric("rewards.py:correct", reward, has_answer=True) == "correct"  # as the metrics name it
    assert resolve_metric(None, reward, has_answer=False) == "reward"


def test_a_short_name_two_functions_share_is_an_error_naming_both():
    reward = reward_of("a.py:score", "b.py:score")
    with pytest.raises(ValueError, match="eval.metric names 'score', which is the name of more than one reward "
                                         "function: 'a.py:score' and 'b.py:score'"):
        resolve_metric("score", reward, has_answer=True)
    assert resolve_metric("b.py:score", reward, has_answer=True) == "b.py:score"
    with pytest.raises(ValueError, match=r"eval.metric = 'scor' is not 'accuracy', 'reward' or a reward function "
                                         r"of this run \(a.py:score, b.py:score\)"):
        resolve_metric("scor", reward, has_answer=True)


def test_a_metric_without_a_value_is_an_error_not_zero():
    with pytest.raises(ValueError, match="eval.metric = 'short' has no value"):
        metric_value("short", None, 0.5, {"short": None})
    with pytest.raises(ValueError, match="eval.metric = 'reward' has no value"):
        metric_value("reward", 1.0, None, {})
    assert metric_value("short", None, None, {"short": 0.0}) == 0.0
