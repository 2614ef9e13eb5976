"""Issue 34's failure paths of a run directory: a refused --resume changes nothing on disk, a finished run resumed
does not evaluate twice, a full disk during a save says so and keeps the previous checkpoint, a truncated
model.safetensors is one line naming the file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tandemrl.cli import main

SMALL = ["--set", "model.device=cpu", "--set", "eval.limit=4", "--set", "eval.pass_k=0",
         "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2", "--set", "log.tensorboard=false",
         "--set", "checkpoint.every_steps=1"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` and a hash of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def eval_rows(run: Path, step: int) -> int:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sum(1 for r in rows if r["step"] == step and "eval/accuracy" in r)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of two steps, checkpoints after each."""
    root = tmp_path_factory.mktemp("finished")
    run = root / "run"
    code = main(["train", "--out", str(run), "--set", f'model.tiny_dir="{root / "tiny"}"', "--set",
                 "train.max_steps=2", *SMALL])
    assert code == 0
    return run


def copy_run(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


@pytest.mark.parametrize("overrides, key", [
    (["--set", 'data.task="synthetic:copy"'], "data.task"),
    (["--set", "model.lora.enabled=true"], "model.lora.enabled"),
    (["--set", "rollout.prompts_per_step=4"], "rollout.prompts_per_step"),
    (["--config", "{other}"], "data.task"),
])
def test_a_refused_resume_changes_nothing_and_the_run_resumes_after(finished, tmp_path, capsys, overrides, key):
    """Issue 34, path 1: the refused resume used to overwrite config.toml, so the run could not resume anymore."""
    run = copy_run(finished, tmp_path)
    other = tmp_path / "other.toml"  # the run's settings but another task
    other.write_text(f'[model]\ndevice = "cpu"\ntiny_dir = "{finished.parent / "tiny"}"\n[data]\ntask = "synthetic:copy"\n'
                     "[rollout]\nprompts_per_step = 2\ngroup_size = 2\n[train]\nmax_steps = 2\n"
                     "[eval]\nlimit = 4\npass_k = 0\n[log]\ntensorboard = false\n[checkpoint]\nevery_steps = 1\n")
    before = snapshot(run)
    capsys.readouterr()
    code = main(["train", "--resume", "--out", str(run), *[a.format(other=other) for a in overrides]])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert key in err, err
    if not err.startswith("error: invalid config"):  # refused by the checkpoint (a config error stops earlier)
        assert len(err.splitlines()) == 1 and "nothing was changed" in err, err
    assert snapshot(run) == before
    assert main(["train", "--resume", "--out", str(run), "--set", "train.max_steps=3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def test_a_finished_run_resumed_says_so_and_writes_nothing(finished, tmp_path, capsys):
    """Issue 34, path 2: the resume of a finished run appended a second final evaluation row."""
    run = copy_run(finished, tmp_path)
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run)]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "already finished at step 2" in out and "train.max_steps" in out, out
    assert snapshot(run) == before and eval_rows(run, 2) == 1


def test_a_kill_after_the_last_checkpoint_resumes_to_the_summary_alone(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()  # what a kill between the final checkpoint and the summary leaves
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", "--out", str(run)]) == 0
    assert (run / "metrics.jsonl").read_bytes() == metrics
    again = json.loads((run / "summary.json").read_text())
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in summary.items() if k != "seconds"}


def test_a_finished_run_trains_on_with_a_larger_max_steps(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    assert main(["train", "--resume", "--out", str(run), "--set", "train.max_steps=4"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert eval_rows(run, 2) == 1 and eval_rows(run, 4) == 1
    # a kill after step 3's checkpoint, then a resume that lowers max_steps to 3: the final evaluation still runs
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest").write_text("step-00000003\n")
    assert main(["train", "--resume", "--out", str(run), "--set", "train.max_steps=3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3 and eval_rows(run, 3) == 1


# ------------------------------------------------------------------------------------ a full disk (path 8)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 1.5 MiB (root only; skipped where mounting is not allowed); `remount(size)` resizes it."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")

    def remount(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)

    try:
        yield mnt, remount
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_during_a_save_says_so_and_keeps_the_previous_checkpoint(small_disk, tmp_path, capsys):
    """Issue 34, path 8: torch.save's "unexpected pos N vs M" reached the user instead of "the disk is full"."""
    from tandemrl.train.checkpoint import find_latest, is_complete_checkpoint

    disk, remount = small_disk
    run = disk / "run"
    args = ["train", "--out", str(run), "--set", f'model.tiny_dir="{tmp_path / "tiny"}"', *SMALL]
    capsys.readouterr()
    assert main([*args, "--set", "train.max_steps=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the disk is full" in err and "unexpected pos" not in err, err
    assert "could not write checkpoint step 2 to" in err and "the previous checkpoint step-00000001 is intact" in err
    latest = find_latest(run / "checkpoints")
    assert latest.name == "step-00000001" and is_complete_checkpoint(latest)
    remount("64m")
    assert main(["train", "--resume", "--out", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


# ------------------------------------------------------------------------ a truncated model.safetensors (path 6)


def truncate(file: Path, keep: int | None = None) -> None:
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.truncate(size // 2 if keep is None else keep)


@pytest.mark.parametrize("keep", [None, 5])  # half the data; a torn header
def test_a_truncated_model_directory_is_one_line_naming_the_file(finished, tmp_path, capsys, keep):
    """Issue 34, path 6: a truncated model.safetensors given as model.name_or_path was a SafetensorError traceback."""
    model = tmp_path / "model"
    shutil.copytree(finished.parent / "tiny", model)
    truncate(model / "model.safetensors", keep)
    capsys.readouterr()
    code = main(["train", "--out", str(tmp_path / "run"), "--set", f'model.name_or_path="{model}"', *SMALL])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{model / 'model.safetensors'}" in err and "truncated" in err, err
    assert not (tmp_path / "run").exists()


def test_a_truncated_checkpoint_given_as_the_model_is_one_line_naming_the_file(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    step = run / "checkpoints" / "step-00000002"
    truncate(step / "model.safetensors")
    capsys.readouterr()
    code = main(["eval", "--model", str(step), "--set", "model.device=cpu", "--set", "eval.limit=2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{step / 'model.safetensors'}" in err, err
    # --resume skips the damaged checkpoint (its COMPLETE lists another size) and goes on from step 1
    assert main(["train", "--resume", "--out", str(run), "--set", "train.max_steps=3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
