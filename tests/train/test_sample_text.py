"""samples.jsonl's prompt and completion text, and the completions printed every N steps."""

import io
import json
from pathlib import Path

from rich.console import Console

from tandemrl.config import LogConfig, load_config
from tandemrl.rewards.composite import RewardResult
from tandemrl.telemetry.progress import TrainDisplay
from tandemrl.train.loop import train
from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.train.sample_log import SampleLog, completion_examples, sample_rows, show_completions
from tandemrl.types import Rollout, Sample, Trajectory


def scored(groups: int = 3, size: int = 2, multi_turn: bool = False) -> ScoredRollouts:
    n = groups * size
    group_ids = [g for g in range(groups) for _ in range(size)]
    rollouts = [Rollout(f"r{i}", [1], [2, 3], [-0.1, -0.2], "length" if i % 2 else "stop", text=f"out {i} [b]")
                for i in range(n)]
    trajectories = ([Trajectory(r, final_text=f"answer {i}", turns=2) for i, r in enumerate(rollouts)]
                    if multi_turn else None)
    reward = RewardResult([float(i) for i in range(n)], {"acc": [float(i % 2) for i in range(n)]}, {}, None, 0)
    return ScoredRollouts([Sample(f"q{g}", index=10 + g) for g in group_ids], [f"prompt {g}" for g in group_ids],
                          rollouts, reward, [bool(i % 2) for i in range(n)], group_ids, trajectories)


def test_the_first_rows_carry_prompt_and_completion_text():
    rows = sample_rows(scored(), text_rows=3)
    assert [r.get("prompt") for r in rows] == ["prompt 0", "prompt 0", "prompt 1", None, None, None]
    assert [r.get("completion") for r in rows[:3]] == ["out 0 [b]", "out 1 [b]", "out 2 [b]"]
    assert all("completion" not in r and "transcript" not in r for r in rows[3:])
    # the numeric fields stay on every row
    assert all({"reward", "reward/acc", "tokens", "finish_reason", "group"} <= set(r) for r in rows)
    assert [r["finish_reason"] for r in rows[:2]] == ["stop", "length"]


def test_no_text_by_default_and_with_zero():
    assert all("prompt" not in r for r in sample_rows(scored()))
    assert all("prompt" not in r for r in sample_rows(scored(), text_rows=0))


def test_multi_turn_completion_is_what_the_reward_saw_plus_the_transcript():
    rows = sample_rows(scored(multi_turn=True), text_rows=2)
    assert rows[1]["completion"] == "answer 1" and rows[1]["transcript"] == "out 1 [b]"


def test_sample_log_writes_texts_to_jsonl(tmp_path):
    log = SampleLog(tmp_path, text_per_step=2)
    log.write(1, scored())
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and rows[0]["step"] == 1 and rows[1]["completion"] == "out 1 [b]" and "prompt" not in rows[2]


def test_examples_are_the_first_rollout_of_the_first_groups():
    examples = completion_examples(scored(groups=3, size=2), 2)
    assert [(e.prompt, e.completion, e.reward) for e in examples] == [("prompt 0", "out 0 [b]", 0.0),
                                                                      ("prompt 1", "out 2 [b]", 2.0)]
    assert examples[1].components == {"acc": 0.0}
    assert len(completion_examples(scored(groups=1), 3)) == 1


def printed(step: int, log: LogConfig) -> str:
    out = io.StringIO()
    display = TrainDisplay(10, console=Console(file=out, width=120, force_terminal=False))
    show_completions(display, log, step, scored())
    return out.getvalue()


def test_completions_are_printed_every_n_steps_only():
    log = LogConfig(print_completions_every=5, num_completions_to_print=2)
    assert printed(4, log) == ""
    text = printed(10, log)
    assert "completions at step 10" in text and "prompt 0" in text and "prompt 1" in text and "prompt 2" not in text
    assert "out 0 [b]" in text  # model output is shown as it is, never read as rich markup
    assert printed(10, LogConfig(print_completions_every=0)) == ""


def test_defaults_print_and_log_some_text():
    log = LogConfig()
    assert log.print_completions_every == 50 and log.num_completions_to_print == 2 and log.sample_text_per_step == 8


def test_a_run_logs_and_prints_completions(tmp_path: Path):
    cfg = load_config(None, [
        f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "data.task='synthetic:add'", "train.max_steps=2",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "eval.limit=4", "eval.pass_k=0",
        "checkpoint.every_steps=0", "log.tensorboard=false", "log.sample_text_per_step=3",
        "log.print_completions_every=2"])
    out = io.StringIO()
    train(cfg, tmp_path / "run", console=Console(file=out, width=120))
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [sum("completion" in r for r in rows if r["step"] == step) for step in (1, 2)] == [3, 3]
    assert out.getvalue().count("completions at step") == 1 and "completions at step 2" in out.getvalue()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if m["step"] == 2 and "loss" in m)
    for key in ("reward/accuracy/mean", "reward/accuracy/std", "frac_reward_zero_std", "completions/clipped_ratio",
                "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_frac"):
        assert key in step, key
