"""TRL's reward-function contract: keyword calls, conversational completions, None abstains, async functions,
functions loaded from a file; TRL's documented example reward functions run unchanged (held verbatim below)."""

import asyncio
import dataclasses
import re

import pytest

from tandemrl.rewards.composite import CompositeReward, build_reward, metrics
from tandemrl.rewards.functions import resolve_reward
from tandemrl.rewards.state import RewardTrainerState

# --- TRL's documentation, verbatim (GRPOTrainer: quick start and "Using a custom reward function") --------------


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_num_unique_chars(completions, **kwargs):
    return [len(set(c)) for c in completions]


def reward_func_ids(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func_ground_truth(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            # Calculate math-specific reward
            correct = completion.strip() == "4"
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards


def coding_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "coding":
            # Calculate coding-specific reward
            works = "def" in completion
            reward = 1.0 if works else -1.0
            rewards.append(reward)
        else:
            # Return None for non-coding tasks
            rewards.append(None)
    return rewards


async def async_reward_func(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c) > 3) for c in completions]

# --- end of TRL's examples --------------------------------------------------------------------------------------


def test_trl_examples_on_text_completions():
    reward = build_reward({reward_len: 1.0, reward_num_unique_chars: 1.0, reward_func_ids: 1.0,
                           reward_func_ground_truth: 1.0, async_reward_func: 1.0})
    result = reward(["p1", "p2"], [r"so \boxed{4}", "abc"], {"ground_truth": ["4", "5"]},
                    completion_ids=[[1, 2, 3], [4]])
    assert result.components == {
        "reward_len": [-8.0, -17.0], "reward_num_unique_chars": [11.0, 3.0], "reward_func_ids": [3.0, 1.0],
        "reward_func_ground_truth": [1.0, 0.0], "async_reward_func": [1.0, 0.0]}
    assert result.total == [8.0, -13.0] and result.errors == {}


def test_trl_conversational_example():
    completions = [[{"role": "assistant", "content": "<think>x</think><answer>4</answer>"}],
                   [{"role": "assistant", "content": "4"}]]
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    result = build_reward({format_reward_func: 1.0})(prompts, completions)
    assert result.total == [1.0, 0.0]


def test_none_abstains_for_that_function_only():
    """TRL's multi-task example: each sample is scored by the function of its task; the other abstains."""
    reward = build_reward({math_reward_func: 1.0, coding_reward_func: 2.0})
    result = reward(["2+2", "sum", "3*4", "add"], ["4", "def f(): pass", "13", "no"],
                    {"task": ["math", "coding", "math", "coding"]})
    assert result.components["math_reward_func"] == [1.0, None, -1.0, None]
    assert result.total == [1.0, 2.0, -1.0, -2.0]  # not dropped: the one function that scored it counts
    m = metrics(result)
    assert m["reward/math_reward_func/mean"] == 0.0 and m["reward/coding_reward_func/mean"] == 0.0


def test_all_abstaining_means_no_reward():
    none = build_reward({(lambda completions, **k: [None] * len(completions)): 1.0})
    assert none(["p"], ["c"]).total == [None]


def test_rewards_are_called_by_keyword():
    seen = {}

    def spy(*, prompts, completions, completion_ids, answer):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer)
        return [0.0]

    CompositeReward({"spy": (spy, 1.0)})(["p"], ["c"], {"answer": ["1"]}, completion_ids=[[7, 8]])
    assert seen == {"prompts": ["p"], "completions": ["c"], "ids": [[7, 8]], "answer": ["1"]}


@pytest.mark.parametrize("value", [1e308, -1e308, 10**400, float("inf"), float("nan")])
def test_overflowing_rewards_are_handled_like_nan(value):
    """A reward of 1e308 used to raise OverflowError in the metrics; now the sample is left out and counted."""
    reward = build_reward({(lambda completions, **k: [value, 1.0]): 2.0, (lambda completions, **k: [1.0, 1.0]): 1.0})
    result = reward(["p", "q"], ["a", "b"])
    assert result.total == [None, 3.0] and result.nonfinite == 1
    assert metrics(result)["reward/mean"] == 3.0


def test_weighted_sum_that_overflows_is_left_out():
    big = build_reward({(lambda completions, **k: [3e38, 1.0]): 1.0, (lambda completions, **k: [3e38, 1.0]): 1.0})
    result = big(["p", "q"], ["a", "b"])
    assert result.total == [None, 2.0] and result.nonfinite_by == {"total": 1}


def test_reward_from_a_file_and_errors(tmp_path):
    file = tmp_path / "my_rewards.py"
    file.write_text("def shout(completions, **kwargs):\n    return [float(c.isupper()) for c in completions]\n")
    fn = resolve_reward(f"{file}:shout")
    assert fn(completions=["A", "b"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        resolve_reward(f"{file}:nope")
    with pytest.raises(ValueError, match="no such file"):
        resolve_reward(f"{tmp_path / 'missing.py'}:shout")
    assert build_reward({f"{file}:shout": 1.0}).names == ["shout"]


# --- trainer_state: TRL passes `trainer_state` (where training stands) to every reward function ----------------


def reward_by_step(completions, **kwargs):
    """A TRL reward that shapes itself over training (reads kwargs["trainer_state"], as TRL's docs suggest)."""
    state = kwargs["trainer_state"]
    return [state.global_step / state.max_steps + state.epoch for _ in completions]


def test_trainer_state_reaches_functions_that_take_it():
    seen = []

    def named(prompts, completions, completion_ids, trainer_state):  # no **kwargs: the parameter itself
        seen.append(trainer_state)
        return [0.0] * len(completions)

    state = RewardTrainerState(global_step=3, max_steps=12, epoch=0.5)
    result = build_reward({reward_by_step: 1.0, named: 1.0})(["p"], ["c"], trainer_state=state)
    assert result.components["reward_by_step"] == [0.75] and result.errors == {}
    assert seen == [state]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.global_step = 4  # a reward function cannot move the run


def test_a_function_without_kwargs_still_works_and_does_not_get_trainer_state():
    """Written before trainer_state existed: it names its columns and takes nothing else."""
    def strict(*, prompts, completions, completion_ids, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    state = RewardTrainerState(global_step=1, max_steps=2)
    result = build_reward({strict: 1.0})(["p"], ["4"], {"answer": ["4"]}, trainer_state=state)
    assert result.total == [1.0] and result.errors == {}


def test_a_column_named_trainer_state_is_refused():
    with pytest.raises(ValueError, match="column name 'trainer_state' is reserved"):
        build_reward({reward_len: 1.0})(["p"], ["c"], {"trainer_state": [1]})


# --- names: the metrics' short names, and full names where two functions share one -----------------------------


def test_functions_that_share_a_name_are_both_named_in_full(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "r.py").write_text("def score(completions, **kwargs):\n"
                                                "    return [1.0] * len(completions)\n")
    a, b = f"{tmp_path}/a/r.py:score", f"{tmp_path}/b/r.py:score"
    reward = build_reward({a: 1.0, b: 2.0, "accuracy": 1.0})
    assert reward.names == [a, b, "accuracy"]  # neither takes the short name: it would mean the first silently
    assert reward.find(b, "eval.metric") == b and reward.find("accuracy", "eval.metric") == "accuracy"
    with pytest.raises(ValueError, match=f"eval.metric names 'score', which is the name of more than one reward "
                                         f"function: '{a}' and '{b}'"):
        reward.find("score", "eval.metric")
    single = build_reward({a: 1.0})
    assert single.names == ["score"] and single.find(a, "eval.metric") == "score" and single.find("nope", "x") is None
