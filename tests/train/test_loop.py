"""End-to-end runs of the training loop on the tiny offline model (CPU)."""

import errno
import io
import json
import os
import signal
from pathlib import Path

import pytest
import torch

import tandemrl.train.loop as loop
from tandemrl.config import load_config
from rich.console import Console

import tandemrl.train.checkpoint as ckpt
from tandemrl.cli import main
from tandemrl.train import atomic_dir
from tandemrl.train.checkpoint import find_latest, load_checkpoint
from tandemrl.train.loop import TrainingError, train

# Wall-clock and memory numbers differ between runs; everything else must match exactly.
NONDETERMINISTIC = ("time/", "tokens_per_s", "memory/", "requests/queue_s", "requests/ttft_s", "requests/latency_s")


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
    phases = ("time/rollout", "time/prepare", "time/train", "time/sync", "time/record")  # a step's wall time, in parts
    assert all(rows[3][key] >= 0 for key in phases) and rows[3]["time/prepare"] > 0 and rows[3]["time/record"] > 0
    assert sum(rows[3][key] for key in phases) <= rows[3]["time/step_wall"]
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


def test_sigterm_saves_like_ctrl_c_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    cfg = small_config(tmp_path, "train.max_steps=5", "checkpoint.every_steps=0")
    real_step = loop.train_step
    before = signal.getsignal(signal.SIGTERM)

    def terminated_step(run, state, display):
        if state.step == 1:
            signal.raise_signal(signal.SIGTERM)  # what SLURM/Kubernetes send: step 2 finishes, then save and stop
        return real_step(run, state, display)

    monkeypatch.setattr(loop, "train_step", terminated_step)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run")
    assert "interrupted after step 2 by SIGTERM" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert find_latest(tmp_path / "run" / "checkpoints").name == "step-00000002"
    monkeypatch.setattr(loop, "train_step", real_step)
    assert train(cfg, tmp_path / "run", resume=True)["steps"] == 5
    assert sorted(read_rows(tmp_path / "run")) == [1, 2, 3, 4, 5]


def test_a_raising_reward_is_reported_and_the_run_continues(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = small_config(tmp_path, "train.max_steps=2", "checkpoint.every_steps=0",
                       'reward.weights={accuracy = 1.0, "tests_support.bad_rewards:raises" = 0.5}')
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    rows = read_rows(tmp_path / "run")
    assert rows[1]["reward/errors"] >= 1
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_a_raising_reward_prints_its_traceback_once(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = small_config(tmp_path, "train.max_steps=2", "checkpoint.every_steps=0", "train.max_invalid_reward_steps=5",
                       'reward.weights={accuracy = 1.0, "tests_support.bad_rewards:raises" = 0.5}')
    train(cfg, tmp_path / "run")
    out = capsys.readouterr().out
    assert out.count("Traceback (most recent call last)") == 1
    assert "step 1: reward calls that raised {'raises': 1}" in out and "step 2: reward calls that raised" in out


@pytest.mark.parametrize("bad", ["raises", "always_nan"])
def test_a_reward_that_never_works_stops_the_run(tmp_path, capsys, monkeypatch, bad):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = small_config(tmp_path, "checkpoint.every_steps=0",
                       f'reward.weights={{accuracy = 1.0, "tests_support.bad_rewards:{bad}" = 0.5}}')
    with pytest.raises(TrainingError, match=f"3 steps in a row had no valid reward.*: {bad} ") as err:
        train(cfg, tmp_path / "run")
    assert "accuracy" not in str(err.value).split("usable value:")[1].split("(")[0]
    assert sorted(read_rows(tmp_path / "run")) == [1, 2]  # the third invalid step stops before its update
    if bad == "always_nan":
        assert "NaN/inf values {'always_nan': 16}" in capsys.readouterr().out


def test_a_reward_failing_on_some_samples_keeps_training(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = small_config(tmp_path, "train.max_steps=4", "checkpoint.every_steps=0",
                       'reward.weights={accuracy = 1.0, "tests_support.bad_rewards:nan_on_some" = 0.5}')
    assert train(cfg, tmp_path / "run")["steps"] == 4
    assert read_rows(tmp_path / "run")[4]["reward/nonfinite"] == 8
    assert "NaN/inf values {'nan_on_some': 8}" in capsys.readouterr().out


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


def crashed_during_first_save(run_dir: Path) -> Path:
    """What a kill during the first checkpoint save leaves: metrics rows and a half-written .tmp-step-* folder."""
    leftover = atomic_dir.staging_path(run_dir / "checkpoints", "step-00000003")
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"partial")
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n{"step": 1, "reward/mean": 0.1}\n')
    return leftover


def test_a_rerun_after_a_kill_during_the_first_save_is_allowed(tmp_path):
    leftover = crashed_during_first_save(tmp_path / "run")
    train(small_config(tmp_path, "train.max_steps=3"), tmp_path / "run")
    assert find_latest(tmp_path / "run" / "checkpoints").name == "step-00000003"
    assert not leftover.exists()  # swept by the first complete save
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 3]  # initial eval, 3 steps, final eval: the crashed run's rows are gone


def test_resume_without_a_complete_checkpoint_starts_from_step_0_and_says_so(tmp_path):
    crashed_during_first_save(tmp_path / "run")
    out = io.StringIO()
    summary = train(small_config(tmp_path, "train.max_steps=2"), tmp_path / "run", resume=True,
                    console=Console(file=out, width=200))
    text = " ".join(out.getvalue().split())
    assert "--resume: no complete checkpoint under" in text and "starting from step 0" in text
    assert summary["steps"] == 2 and sorted(read_rows(tmp_path / "run")) == [1, 2]


def test_a_full_disk_during_a_save_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    real_write, saves = ckpt._write_contents, []

    def full_on_second_save(folder, *args):
        saves.append(folder)
        if len(saves) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(folder, *args)

    monkeypatch.setattr(ckpt, "_write_contents", full_on_second_save)
    run = tmp_path / "run"
    code = main(["train", "--out", str(run), "--set", f'model.tiny_dir="{tmp_path / "tiny"}"',
                 "--set", "model.device=cpu", "--set", "train.max_steps=4", "--set", "checkpoint.every_steps=2",
                 "--set", "eval.limit=4", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert str(run / "checkpoints" / "step-00000004") in err and "the disk is full" in err
    assert "the previous checkpoint step-00000002 is intact" in err
    monkeypatch.undo()
    latest = find_latest(run / "checkpoints")
    assert latest.name == "step-00000002"
    from tandemrl.config import load_config as load
    from tandemrl.train.setup import build_run
    assert load_checkpoint(latest, model=build_run(load(run / "config.toml"), run).model)["step"] == 2


def test_a_full_disk_during_a_metrics_write_is_one_error_naming_the_file(tmp_path, capsys, monkeypatch):
    import tandemrl.telemetry.writers as writers

    class FullFile:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_write = writers.JsonlWriter.write

    def fill_after_two(self, step, metrics):
        if step == 2:
            self._fh = FullFile()
        return real_write(self, step, metrics)

    monkeypatch.setattr(writers.JsonlWriter, "write", fill_after_two)
    run = tmp_path / "run"
    code = main(["train", "--out", str(run), "--set", f'model.tiny_dir="{tmp_path / "tiny"}"',
                 "--set", "model.device=cpu", "--set", "train.max_steps=3", "--set", "eval.limit=4",
                 "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2"])
    captured = capsys.readouterr()
    assert code == 2
    error_lines = [line for line in captured.err.splitlines() if "disk is full" in line]
    assert error_lines == [f"error: [Errno {errno.ENOSPC}] cannot write metrics to {run / 'metrics.jsonl'}: "
                           "the disk is full (no space left on device)"]
    assert "Traceback" not in captured.err and "Exception ignored" not in captured.err
    assert "disk is full" not in captured.out  # not mixed into the progress output


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


@pytest.mark.parametrize("overrides", [
    (),
    ("train.tis_cap=2.0", "rollout.temperature=0.7", "train.mini_batches=2"),  # old log-probs fixed up front
])
def test_rollout_logprobs_reach_the_loss(tmp_path, overrides):
    cfg = small_config(tmp_path, "train.max_steps=2", "checkpoint.every_steps=0", "eval.pass_k=0", *overrides)
    train(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    for step in (1, 2):
        row = rows[step]
        # The engine samples with the trainer's own float32 weights: the log-probs agree up to rounding, which
        # also checks that the two line up token for token and use the same temperature.
        assert 0 <= row["mismatch/logp_abs_mean"] <= row["mismatch/logp_abs_max"] < 1e-4, row
        assert row["mismatch/policy_version_lag"] == 0
        assert row["skipped_nonfinite"] == 0
        # What serving the step's requests cost reaches the metrics too.
        assert 0 < row["requests/ttft_s/mean"] <= row["requests/latency_s/mean"] <= row["requests/latency_s/max"]
        assert row["requests/generated_tokens/mean"] == pytest.approx(row["response_length/mean"])
        assert row["requests/kv_peak_mb/max"] > 0 and row["requests/preemptions"] == 0
        if cfg.train.tis_cap > 0:
            assert row["tis/weight_mean"] == pytest.approx(1.0, abs=1e-3) and row["tis/clip_frac"] == 0.0
        else:
            assert not any(key.startswith("tis/") for key in row)


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
    assert "interrupted after step" in output and "by SIGINT" in output
    latest = find_latest(tmp_path / "run" / "checkpoints")
    assert latest is not None and int(latest.name.split("-")[1]) >= 2


def test_training_with_speculative_decoding_by_a_self_draft(tmp_path):
    """The tiny model drafts for itself (a copy the trainer does not update): before the first update every proposal
    is the token the target would sample, so all are kept; after it the target has moved, and some may not be. The
    run trains as usual (rollout.max_tokens=3: the one verify round proposes one token)."""
    cfg = small_config(tmp_path, "train.max_steps=2", "checkpoint.every_steps=0", "eval.pass_k=0",
                       "rollout.speculative.method=\"draft\"", "rollout.speculative.draft_model=\"tiny\"")
    train(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert rows[1]["spec/acceptance_rate"] == 1.0 and rows[1]["spec/mean_accepted_length"] == 2.0
    for row in rows.values():
        assert 0.5 < row["spec/acceptance_rate"] <= 1.0
        assert 1.0 < row["spec/mean_accepted_length"] <= 2.0
        assert row["skipped_nonfinite"] == 0


_NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
_NO_TWO_GPUS = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.mark.parametrize("hot_device, frozen_device", [
    ("cpu", None), ("cpu", "cpu"),  # tandem.frozen_device named: the config and wiring path
    pytest.param("cuda", "cpu", marks=_NO_CUDA), pytest.param("cuda:0", "cuda:1", marks=_NO_TWO_GPUS),
])
def test_tandem_training_keeps_the_frozen_model_and_weighs_its_tokens(tmp_path, hot_device, frozen_device):
    """`tandemrl train --set tandem.enabled=true --set tandem.p=0.7` on the CPU default: the frozen model (a second
    copy of the starting model) never changes, its tokens weigh tandem.frozen_token_weight, the metrics say who wrote
    what. The same with the frozen model on another device (tandem.frozen_device)."""
    from tandemrl.train.loop import train_step
    from tandemrl.train.setup import TrainerState, build_run
    from tandemrl.telemetry.progress import TrainDisplay

    placement = [f'model.device="{hot_device}"']
    if frozen_device is not None:
        placement.append(f'tandem.frozen_device="{frozen_device}"')
    cfg = small_config(tmp_path, "tandem.enabled=true", "tandem.p=0.7", "rollout.max_tokens=6", *placement)
    run = build_run(cfg, tmp_path / "run")
    from tandemrl.engine.model.placement import canonical

    slot = run.backend.runner.slots["frozen"]
    frozen = slot.model
    assert slot.device == canonical(frozen_device or hot_device) == canonical(next(frozen.parameters()).device)
    assert run.backend.runner.target.device == canonical(hot_device)
    before = [p.detach().clone() for p in frozen.parameters()]
    assert not any(p.requires_grad for p in frozen.parameters())
    state = TrainerState()
    with TrainDisplay(2, 0, None) as display:
        rows = [train_step(run, state, display) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(before, frozen.parameters()))
    for row in rows:
        assert row["tandem/hot_token_fraction"] + row["tandem/frozen_token_fraction"] == pytest.approx(1.0)
        assert 0 < row["tandem/frozen_token_fraction"] < 1 and row["skipped_nonfinite"] == 0
    run.backend.close()


def test_a_bfloat16_frozen_model_writes_beside_a_float32_hot_one(tmp_path):
    """tandem.frozen_dtype: the frozen model (and its KV cache) in bfloat16 while the hot model trains in float32."""
    from tandemrl.train.loop import train_step
    from tandemrl.train.setup import TrainerState, build_run
    from tandemrl.telemetry.progress import TrainDisplay

    cfg = small_config(tmp_path, "tandem.enabled=true", "tandem.p=0.5", "rollout.max_tokens=6",
                       'model.dtype="float32"', 'tandem.frozen_dtype="bfloat16"')
    run = build_run(cfg, tmp_path / "run")
    slots = run.backend.runner.slots
    assert next(slots["frozen"].model.parameters()).dtype == torch.bfloat16
    assert next(slots["target"].model.parameters()).dtype == torch.float32
    with TrainDisplay(1, 0, None) as display:
        row = train_step(run, TrainerState(), display)
    assert 0 < row["tandem/frozen_token_fraction"] < 1 and row["skipped_nonfinite"] == 0
    run.backend.close()


def test_frozen_tokens_get_the_configured_loss_weight():
    from tandemrl.train.rollouts import weigh_frozen_tokens
    from tandemrl.types import Rollout

    tandem = Rollout("a", [1], [5, 6, 7], [-1.0] * 3, "stop", token_sources=[True, False, True])
    plain = Rollout("b", [1], [5, 6], [-1.0] * 2, "stop")
    weigh_frozen_tokens([tandem, plain], 0.2)
    assert tandem.token_weights() == [1.0, 0.2, 1.0] and plain.token_weights() == [1.0, 1.0]


def test_cpu_threads_are_one_for_small_models_unless_set():
    from tandemrl.train.setup import set_cpu_threads

    before = torch.get_num_threads()
    try:
        small = torch.nn.Linear(4, 4)
        set_cpu_threads(None, small, torch.device("cpu"))
        assert torch.get_num_threads() == 1
        set_cpu_threads(2, small, torch.device("cpu"))
        assert torch.get_num_threads() == 2
        torch.set_num_threads(before)
        set_cpu_threads(None, small, torch.device("cuda"))  # the GPU's work: left alone
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_max_minutes_ends_the_run_early_with_its_final_evaluation(tmp_path):
    """train.max_minutes: once the run has used its time no step starts; the final evaluation and the last checkpoint
    are written as after max_steps."""
    cfg = small_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.002", "eval.pass_k=0")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] < 1000 and summary["final"]["accuracy"] is not None
    assert (tmp_path / "run" / "summary.json").exists()
    assert sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
