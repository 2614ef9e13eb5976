import json
import math

import pytest

from tandemrl.rewards.composite import CompositeReward, build_reward, metrics


def const(value):
    def fn(prompts, completions, **kwargs):
        return [value] * len(completions)

    return fn


def raising(prompts, completions, **kwargs):
    raise RuntimeError("boom")


def nan_second(prompts, completions, **kwargs):
    return [1.0, float("nan"), float("inf"), 0.5][: len(completions)]


def test_weighted_total_and_columns_passed():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [len(c) for c in completions]

    reward = CompositeReward({"a": (const(1.0), 2.0), "len": (spy, 0.5)})
    result = reward(["p", "q"], ["xx", "yyyy"], {"answer": ["1", "2"]})
    assert result.total == [3.0, 4.0]
    assert result.components == {"a": [1.0, 1.0], "len": [2.0, 4.0]}
    assert seen == {"answer": ["1", "2"], "completion_ids": [[], []]}
    assert result.errors == {} and result.first_traceback is None and result.nonfinite == 0


def test_raising_component_is_contained():
    reward = CompositeReward({"ok": (const(1.0), 1.0), "bad": (raising, 1.0)})
    result = reward(["p"] * 3, ["c"] * 3, {})
    assert result.components["ok"] == [1.0] * 3
    assert result.components["bad"] == [None] * 3
    assert result.total == [None] * 3
    assert result.errors == {"bad": 1} and result.invalid_components() == ["bad"]
    assert "RuntimeError: boom" in result.first_traceback and "'bad'" in result.first_traceback
    m = metrics(result)
    assert m["reward/errors"] == 1.0 and m["reward/ok/mean"] == 1.0 and m["reward/mean"] == 0.0


def test_nan_and_inf_become_none():
    reward = CompositeReward({"ok": (const(1.0), 1.0), "nan": (nan_second, 2.0)})
    result = reward(["p"] * 4, ["c"] * 4, {})
    assert result.components["nan"] == [1.0, None, None, 0.5]
    assert result.total == [3.0, None, None, 2.0]
    assert result.nonfinite == 2 and result.nonfinite_by == {"nan": 2}
    assert result.errors == {} and result.invalid_components() == []  # "nan" still gave two usable values
    m = metrics(result)
    assert m["reward/mean"] == 2.5 and m["reward/std"] == 0.5
    assert m["reward/nan/mean"] == 0.75
    assert m["reward/nonfinite"] == 2.0
    json.dumps(m)
    assert all(math.isfinite(v) for v in m.values())


def test_wrong_length_and_non_numbers_are_errors():
    def short(prompts, completions, **kwargs):
        return [1.0]

    def words(prompts, completions, **kwargs):
        return ["high"] * len(completions)

    reward = CompositeReward({"short": (short, 1.0), "words": (words, 1.0), "scalar": (lambda prompts, completions, **k: 1.0, 1.0)})
    result = reward(["p", "p"], ["a", "b"], {})
    assert result.errors == {"short": 1, "words": 1, "scalar": 1}
    assert "returned 1 values for 2 completions" in result.first_traceback
    assert result.total == [None, None]


def test_rejects_bad_inputs():
    with pytest.raises(ValueError):
        CompositeReward({})
    with pytest.raises(ValueError, match="finite numeric weight"):
        CompositeReward({"a": (const(1.0), float("nan"))})
    reward = CompositeReward({"a": (const(1.0), 1.0)})
    with pytest.raises(ValueError, match="column 'answer' has 1 values for 2"):
        reward(["p", "p"], ["a", "b"], {"answer": ["1"]})
    with pytest.raises(ValueError, match="prompts"):
        reward(["p"], ["a", "b"], {})


def test_build_reward_end_to_end():
    reward = build_reward({"accuracy": 1.0, "format": 0.1, "tandemrl.rewards.functions:length_penalty": 0.0})
    assert reward.names == ["accuracy", "format", "length_penalty"]
    result = reward(["p", "p", "p"], ["#### 72", "72 maybe", "no"], {"answer": ["72", "72", "72"]})
    assert result.components["accuracy"] == [1.0, 1.0, 0.0]
    assert result.components["format"] == [1.0, 0.0, 0.0]
    assert result.total == pytest.approx([1.1 - 7 / 1000 * 0.0, 1.0, 0.0])
    m = reward.metrics(result)
    assert set(m) == {
        "reward/mean", "reward/std", "reward/accuracy/mean", "reward/format/mean",
        "reward/length_penalty/mean", "reward/errors", "reward/nonfinite",
    }
    assert m["reward/accuracy/mean"] == pytest.approx(2 / 3)


def test_build_reward_name_clash_keeps_full_name():
    reward = build_reward({"accuracy": 1.0, "tandemrl.rewards.functions:accuracy": 1.0})
    assert reward.names == ["accuracy", "tandemrl.rewards.functions:accuracy"]


def test_build_reward_errors():
    with pytest.raises(ValueError, match="no reward function"):
        build_reward({})
    with pytest.raises(ValueError, match="unknown reward"):
        build_reward({"acuracy": 1.0})
