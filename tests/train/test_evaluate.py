"""Evaluation reports a failing reward as training does: a value no test prompt got is missing (never 0.0), an
eval.metric without a value stops with the reward's error, and reward functions get `trainer_state` (the step
evaluated) as in training."""

import json
from pathlib import Path

import pytest

from tandemrl.cli import main
from tandemrl.config import load_config
from tandemrl.train.eval_run import evaluate_config, run_config
from tandemrl.train.evaluate import EvaluationError
from tandemrl.train.inputs import RunInputs, run_reward
from tandemrl.train.checkpoint import find_latest
from tandemrl.train.loop import train
from tests.train.test_loop import small_config

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]

REWARDS = '''
import json
from pathlib import Path


def short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)  # one value too few


def needs_column(completions, **kwargs):
    return [float(len(c)) for c, _ in zip(completions, kwargs["difficulty"])]  # KeyError: no such column


def gone_at_the_end(completions, trainer_state, **kwargs):
    return [None if trainer_state.global_step == trainer_state.max_steps else 1.0 for _ in completions]


def record(completions, **kwargs):
    state = kwargs["trainer_state"]
    with open(Path(__file__).with_suffix(".jsonl"), "a") as f:
        f.write(json.dumps([state.global_step, state.max_steps, state.epoch, len(completions)]) + "\\n")
    return [0.0] * len(completions)
'''


@pytest.fixture
def user_files(tmp_path: Path) -> Path:
    (tmp_path / "X.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "rewards2.py").write_text(REWARDS)
    return tmp_path


def eval_options(folder: Path, *sets: str) -> list[str]:
    return [f'model.tiny_dir="{folder / "tiny"}"', "model.device=cpu", f"data.path={folder / 'X.jsonl'}",
            "eval.pass_k=0", *sets]


def eval_args(folder: Path, *sets: str) -> list[str]:
    return ["eval", *[arg for option in eval_options(folder, *sets) for arg in ("--set", option)]]


def test_a_metric_whose_reward_returns_too_few_values_is_an_error_not_zero(user_files, capsys):
    args = eval_args(user_files, f'reward.functions=["{user_files / "rewards2.py"}:short"]', "eval.metric=short")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: eval.metric = 'short' has no value: none of the 2 test prompts got a usable one from reward " \
           "function 'short' (reward calls that raised {'short': 1}" in err
    assert "reward 'short' returned 1 values for 2 completions" in err  # the first failing call's traceback
    assert "short 0.000" not in capsys.readouterr().out
    short = f'reward.functions=["{user_files / "rewards2.py"}:short"]'
    with pytest.raises(EvaluationError, match="eval.metric = 'short' has no value"):  # Trainer.evaluate() too
        evaluate_config(load_config(None, eval_options(user_files, short, "eval.metric=short")))


def test_a_reward_that_always_raises_is_reported_and_missing_not_zero(user_files, capsys):
    args = eval_args(user_files, f'reward.functions=["{user_files / "rewards2.py"}:needs_column"]') + ["--json"]
    assert main(args) == 0
    printed = capsys.readouterr()
    result = json.loads(printed.out)
    assert result["metric"] == "accuracy" and result["reward"] is None  # not 0.0
    assert result["components"] == {"needs_column": None} and result["reward_errors"] == {"needs_column": 1}
    assert "first_traceback" not in result
    assert "evaluation: reward calls that raised {'needs_column': 1}" in printed.err
    assert "no test prompt got a usable reward" in printed.err and "KeyError: 'difficulty'" in printed.err
    assert main(args[:-1]) == 0
    assert "reward missing" in capsys.readouterr().out


def test_a_training_run_records_a_missing_reward_as_null(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = small_config(tmp_path, "train.max_steps=1", "checkpoint.every_steps=0", "train.max_invalid_reward_steps=5",
                       'reward.weights={accuracy = 1.0, "tests_support.bad_rewards:raises" = 0.5}')
    summary = train(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["initial"]["reward"] is None and saved["final"]["reward"] is None  # was 0.0
    assert saved["initial"]["reward_errors"]["raises"] >= 1 and summary["initial"]["components"]["raises"] is None
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert evals and all("eval/reward" not in r and r["eval/reward/errors"] >= 1 for r in evals)
    assert "step 0: evaluation: reward calls that raised {'raises':" in capsys.readouterr().out


def test_rewards_get_the_trainer_state_in_training_and_in_evaluation(user_files):
    reward = f"{user_files / 'rewards2.py'}:record"
    cfg = small_config(user_files, "train.max_steps=3", f"data.path={user_files / 'X.jsonl'}",
                       f'reward.functions=["accuracy", "{reward}"]', "eval.pass_k=0")
    train(cfg, user_files / "run")
    log = user_files / "rewards2.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [step for step, *_ in calls]
    assert steps[0] == 0 and steps[-1] == 3 and steps == sorted(steps)  # initial evaluation ... final one
    assert [n for step, _, _, n in calls if n == 16] and {step for step, _, _, n in calls if n == 16} == {0, 1, 2}
    assert {max_steps for _, max_steps, _, _ in calls} == {3}
    epochs = [epoch for _, _, epoch, _ in calls]
    assert epochs[0] == 0.0 and epochs == sorted(epochs) and epochs[-1] > 0  # 4 of 22 rows a step: over 1/2 epoch
    log.unlink()
    evaluate_config(run_config(user_files / "run"), source=user_files / "run")  # `tandemrl eval run`
    again = [json.loads(line) for line in log.read_text().splitlines()]
    assert {(step, epoch) for step, _, epoch, _ in again} == {(3, epochs[-1])}  # the checkpoint's step and epoch


def test_a_run_trained_with_a_python_callable_says_how_to_give_it_again(tmp_path):
    """`tandemrl eval RUN` of a Trainer(reward_funcs=[correct]) run: its config says `inline:correct`."""
    cfg = small_config(tmp_path, 'reward.functions=["inline:correct"]')
    with pytest.raises(ValueError, match=r"reward 'inline:correct' was a Python callable \(correct\) given to "
                                         r"Trainer\(reward_funcs=...\); a callable is not saved with the run"):
        evaluate_config(cfg)
    given = RunInputs(reward_funcs={"inline:correct": lambda completions, **kwargs: [1.0] * len(completions)})
    assert run_reward(cfg, given).names == ["correct"]  # given again (the Python API), it is found by its name
    two = small_config(tmp_path, 'reward.functions=["inline:correct", "inline:1-correct"]')
    assert run_reward(two, RunInputs(reward_funcs=dict.fromkeys(two.reward.functions, given.reward_funcs[
        "inline:correct"]))).names == ["inline:correct", "inline:1-correct"]  # one name: both logged in full


def test_a_run_whose_last_evaluation_has_no_metric_saves_its_steps_then_stops(user_files, capsys):
    reward = f"{user_files / 'rewards2.py'}:gone_at_the_end"
    cfg = small_config(user_files, "train.max_steps=2", "checkpoint.every_steps=0", "eval.pass_k=0",
                       f"data.path={user_files / 'X.jsonl'}", f'reward.functions=["{reward}"]',
                       "eval.metric=gone_at_the_end")
    with pytest.raises(EvaluationError, match=r"none of the 2 test prompts got a usable one from reward function "
                                              r"'gone_at_the_end' \(it returned None \(abstained\) for all of them\)"):
        train(cfg, user_files / "run")
    assert find_latest(user_files / "run" / "checkpoints").name == "step-00000002"  # the steps are kept
    assert "the evaluation after step 2 failed: saved" in capsys.readouterr().out
