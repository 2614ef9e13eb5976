from pathlib import Path

from tandemrl.train import learning_signal
from tandemrl.train.learning_signal import flat_reward_streak, flat_reward_warning
from tandemrl.train.loop import train
from tests.train.test_loop import small_config

FLAT = {"frac_reward_zero_std": 1.0, "reward/mean": 0.0, "completions/clipped_ratio": 1.0}


def test_the_streak_counts_flat_steps_and_restarts_on_any_signal():
    assert flat_reward_streak(0, FLAT) == 1
    assert flat_reward_streak(5, FLAT) == 6
    assert flat_reward_streak(5, {**FLAT, "frac_reward_zero_std": 0.75}) == 0


def test_the_warning_comes_at_the_threshold_then_each_time_the_streak_doubles():
    n = learning_signal.FLAT_STEPS_BEFORE_WARNING
    warned = [s for s in range(1, 20 * n) if flat_reward_warning(100, s, FLAT, 3) is not None]
    assert warned == [n, 2 * n, 4 * n, 8 * n, 16 * n]


def test_the_warning_names_the_steps_and_the_token_budget():
    n = learning_signal.FLAT_STEPS_BEFORE_WARNING
    text = flat_reward_warning(40, n, FLAT, 3)
    assert f"steps {40 - n + 1}-40" in text and "rollout.max_tokens = 3" in text and "100%" in text


def test_a_run_whose_reward_never_differs_is_warned(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    monkeypatch.setattr(learning_signal, "FLAT_STEPS_BEFORE_WARNING", 2)
    cfg = small_config(tmp_path, "train.max_steps=4", "checkpoint.every_steps=0",
                       'reward.functions=["tests_support.bad_rewards:constant"]', "eval.metric=reward")
    train(cfg, tmp_path / "run")
    out = capsys.readouterr().out
    assert "steps 1-2: in every group all samples got the same reward" in out
    assert "steps 1-4:" in out and "steps 1-3:" not in out

