"""End-to-end runs of the training loop on the tiny offline model (CPU)."""

import json
import signal
from pathlib import Path

import pytest
import torch

import tandemrl.train.loop as loop
from tandemrl.config import load_config
from tandemrl.train.checkpoint import find_latest
from tandemrl.train.loop import TrainingError, train

# Wall-clock and memory numbers differ between runs; everything else must match exactly.
NONDETERMINISTIC = ("time/", "tokens_per_s", "memory/")


def small_config(tmp_path: Path, *overrides: str):
    return load_config(None, [
        f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "train.max_steps=8", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "eval.limit=8", "eval.pass_k=2", "checkpoint.every_steps=3", "log.tensorboard=false",
        *overrides,
    ])


def read_rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "reward/mean" in r}


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC)}


def test_run_writes_everything_a_user_expects(tmp_path):
    cfg = small_config(tmp_path, "train.max_steps=3")
    summary = train(cfg, tmp_path / "run")
    run = tmp_path / "run"
    assert (run / "config.toml").is_file() and (run / "summary.json").is_file()
    assert json.loads((run / "summary.json").read_text()) == summary
    assert set(summary["initial"]) >= {"accuracy", "reward"} and set(summary["final"]) >= {"accuracy", "reward"}
    assert summary["steps"] == 3
    rows = read_rows(run)
    assert sorted(rows) == [1, 2, 3]
    for key in ("reward/mean", "reward/std", "reward/accuracy/mean", "accuracy", "loss",
                "kl", "clip_frac", "entropy", "response_length/mean", "tokens_per_s", "time/step", "memory/peak_gb"):
        assert key in rows[3], key
    assert find_latest(run / "checkpoints").name == "step-00000003"
    loaded = load_config(run / "config.toml")
    assert loaded == cfg


def test_interrupt_then_resume_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    cfg = small_config(tmp_path, "train.max_steps=9")
    train(cfg, tmp_path / "whole")

    real_step = loop.train_step

    def interrupted_step(run, state, display):
        if state.step == 3:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C during step 4: it finishes, then the run saves and stops
        return real_step(run, state, display)

    monkeypatch.setattr(loop, "train_step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "split")
    assert find_latest(tmp_path / "split" / "checkpoints").name == "step-00000004"
    monkeypatch.setattr(loop, "train_step", real_step)
    resumed = train(cfg, tmp_path / "split", resume=True)

    whole, split = read_rows(tmp_path / "whole"), read_rows(tmp_path / "split")
    assert sorted(split) == list(range(1, 10))
    for step in range(5, 10):  # the five steps after the interruption
        assert comparable(split[step]) == comparable(whole[step]), step
    assert resumed["final"] == json.loads((tmp_path / "whole" / "summary.json").read_text())["final"]


def test_a_raising_reward_is_reported_and_the_run_continues(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = small_config(tmp_path, "train.max_steps=2", "checkpoint.every_steps=0",
                       'reward.weights={accuracy = 1.0, "tests_support.bad_rewards:raises" = 0.5}')
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    rows = read_rows(tmp_path / "run")
    assert rows[1]["reward/errors"] >= 1
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_nonfinite_losses_are_skipped_then_the_run_stops(tmp_path, monkeypatch):
    cfg = small_config(tmp_path, "train.max_nonfinite_steps=2", "checkpoint.every_steps=1")
    real = loop.policy_update.__globals__["completion_logprobs"]

    def poisoned(model, batch, temperature, chunk):
        out = real(model, batch, temperature, chunk)
        out.logprobs = out.logprobs * float("nan")
        return out

    before = {k: v.clone() for k, v in train_model_weights(tmp_path, cfg).items()}
    monkeypatch.setitem(loop.policy_update.__globals__, "completion_logprobs", poisoned)
    with pytest.raises(TrainingError, match="2 steps in a row had a non-finite loss"):
        train(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert rows[1]["skipped_nonfinite"] == 1
    # Skipped steps never touched the weights.
    latest = find_latest(tmp_path / "run" / "checkpoints")
    from safetensors.torch import load_file
    saved = load_file(latest / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(tensor, before[name]), name


def train_model_weights(tmp_path, cfg) -> dict:
    from safetensors.torch import load_file
    from tandemrl.models.load import resolve_name_or_path

    path = resolve_name_or_path(cfg.model.name_or_path, tiny_dir=cfg.model.tiny_dir, tiny_seed=cfg.model.tiny_seed)
    return load_file(Path(path) / "model.safetensors")


def test_bad_inputs_fail_before_any_work(tmp_path):
    with pytest.raises(Exception, match="no such file"):
        train(small_config(tmp_path, "data.task=gsm8k", f'data.path="{tmp_path / "nowhere"}"'), tmp_path / "a")
    empty_model = tmp_path / "not-a-model"
    empty_model.mkdir()
    with pytest.raises(Exception, match="no config.json"):
        train(small_config(tmp_path, f'model.name_or_path="{empty_model}"'), tmp_path / "b")
    assert not (tmp_path / "a" / "metrics.jsonl").exists()
    assert not (tmp_path / "b" / "metrics.jsonl").exists()


def test_a_second_run_into_the_same_directory_is_refused(tmp_path):
    cfg = small_config(tmp_path, "train.max_steps=1")
    train(cfg, tmp_path / "run")
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg, tmp_path / "run")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_same_loop_trains_in_bf16_on_a_gpu(tmp_path):
    cfg = small_config(tmp_path, "model.device=cuda", "train.max_steps=3")
    summary = train(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert summary["steps"] == 3
    assert all(rows[s]["skipped_nonfinite"] == 0 and rows[s]["memory/peak_gb"] > 0 for s in (1, 2, 3))


@pytest.mark.parametrize("overrides", [
    ("model.lora.enabled=true", "model.lora.rank=4", "train.kl_beta=0.05"),  # reference = base model, adapter off
    ("train.kl_beta=0.05", "train.epochs_per_batch=2", "train.mini_batches=2", "train.micro_batch_size=3"),
    ("rollout.backend=hf", "train.aggregation=seq-mean-token-sum-norm", "train.advantage=dr_grpo"),
    ("model.gradient_checkpointing=true", "train.aggregation=seq-mean-token-mean", "train.lr_schedule=cosine"),
])
def test_training_variants_run_and_report_finite_metrics(tmp_path, overrides):
    cfg = small_config(tmp_path, "train.max_steps=2", "checkpoint.every_steps=0", "eval.pass_k=0", *overrides)
    summary = train(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert summary["steps"] == 2
    for step in (1, 2):
        assert rows[step]["skipped_nonfinite"] == 0
        assert all(rows[step][k] is not None for k in ("loss", "kl", "entropy", "grad_norm"))
    if cfg.train.kl_beta > 0:
        assert rows[2]["kl"] >= 0.0


def test_ctrl_c_on_the_command_line_saves_and_exits_130(tmp_path):
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "tandemrl.cli", "train", "--out", str(tmp_path / "run"),
           "--set", f'model.tiny_dir="{tmp_path / "tiny"}"', "--set", "model.device=cpu",
           "--set", "train.max_steps=100000", "--set", "eval.limit=4", "--set", "eval.pass_k=0",
           "--set", "checkpoint.every_steps=0", "--set", "log.tensorboard=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("step 2/") or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "interrupted after step" in output
    latest = find_latest(tmp_path / "run" / "checkpoints")
    assert latest is not None and int(latest.name.split("-")[1]) >= 2
