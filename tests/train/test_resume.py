"""What --resume says: the checkpoint it continues from and every changed key; a refusal names only the keys that
may block it; a changed learning rate takes effect; a directory without a run is named as such."""

from __future__ import annotations

import io
import shutil
import signal
from pathlib import Path

import pytest
from rich.console import Console

import tandemrl.train.loop as loop
from tandemrl.cli import main
from tandemrl.config import load_config
from tandemrl.train.setup import build_run
from tandemrl.train.state_io import restore_run

SMALL = ["model.device=cpu", "eval.limit=4", "eval.pass_k=0", "rollout.prompts_per_step=2", "rollout.group_size=2",
         "log.tensorboard=false", "checkpoint.every_steps=1", "train.lr=1e-3"]


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of two steps, checkpoints after each."""
    root = tmp_path_factory.mktemp("finished")
    run = root / "run"
    assert main(["train", "--out", str(run), *sets(f'model.tiny_dir="{root / "tiny"}"', "train.max_steps=2",
                                                    *SMALL)]) == 0
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def test_a_refusal_names_the_blocking_key_and_the_allowed_ones_apart(run, capsys):
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run),
                 *sets("rollout.prompts_per_step=4", "train.max_steps=5")]) == 2
    err = capsys.readouterr().err.strip()
    blocking, _, allowed = err.partition("may change on resume")
    assert "may block it: rollout.prompts_per_step (2 -> 4)" in blocking, err
    assert "train.max_steps" not in blocking and "train.max_steps (2 -> 5)" in allowed, err


def test_a_resume_says_where_it_continues_from_and_what_changed(run, capsys):
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run), *sets("train.max_steps=3", "train.lr=5e-4")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resuming")]
    assert lines == [f"resuming {run} from step 2 ({run / 'checkpoints' / 'step-00000002'}); changed since its "
                     "config.toml: train.lr (0.001 -> 0.0005), train.max_steps (2 -> 3)"], lines


def test_a_changed_learning_rate_takes_effect_on_resume(run):
    """The optimizer's and scheduler's saved states carry the old lr: restoring them used to keep it silently."""
    cfg = load_config(run / "config.toml", ["train.lr=5e-4", "train.max_steps=3"])
    restored = build_run(cfg, run, None, None)
    restore_run(restored)
    assert [g["lr"] for g in restored.optimizer.param_groups] == [5e-4]
    assert restored.scheduler.base_lrs == [5e-4] and restored.scheduler.get_last_lr() == [5e-4]
    restored.scheduler.step()  # the schedule goes on from the new rate
    assert restored.optimizer.param_groups[0]["lr"] == 5e-4


def test_a_run_dir_with_checkpoints_names_resume_for_the_cli_and_python(run, capsys):
    capsys.readouterr()
    assert main(["train", "--out", str(run), *sets(f'model.tiny_dir="{run.parent / "tiny"}"', *SMALL)]) == 2
    err = capsys.readouterr().err
    assert "pass --resume" in err and "train(resume=True)" in err, err


@pytest.mark.parametrize("make, why", [
    (lambda out: None, "no such directory"),
    (lambda out: out.mkdir(), "no config.toml there"),
    (lambda out: (out / "checkpoints").mkdir(parents=True), "no config.toml there"),
])
@pytest.mark.parametrize("config", [False, True])
def test_resume_of_a_directory_without_a_run_says_so(tmp_path, capsys, make, why, config):
    out = tmp_path / "nope"
    make(out)
    extra = ["--config", str(tmp_path / "c.toml")] if config else []
    (tmp_path / "c.toml").write_text("[train]\nmax_steps = 2\n")
    assert main(["train", "--out", str(out), "--resume", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --resume: {out} holds no run to resume ({why}); to start a new run there, drop --resume"


def test_the_interrupt_line_keeps_the_command_whole_in_a_narrow_log(tmp_path, monkeypatch):
    real_step = loop.train_step

    def interrupted_step(run, state, display):
        if state.step == 0:
            signal.raise_signal(signal.SIGINT)  # the step finishes, then the run saves and stops
        return real_step(run, state, display)

    monkeypatch.setattr(loop, "train_step", interrupted_step)
    out, log = tmp_path / "a-rather-long-run-directory-name", io.StringIO()
    cfg = load_config(None, [f'model.tiny_dir="{tmp_path / "tiny"}"', "train.max_steps=3", *SMALL])
    with pytest.raises(KeyboardInterrupt):
        loop.train(cfg, out, console=Console(file=log, width=40))  # a log file: no terminal, a narrow width
    assert f"continue with: tandemrl train --resume --out {out}\n" in log.getvalue(), log.getvalue()


def test_a_run_from_two_configs_records_the_merge_and_resumes_from_it(tmp_path, capsys):
    import tomllib

    base, more = tmp_path / "base.toml", tmp_path / "more.toml"
    base.write_text(f'[model]\ntiny_dir = "{tmp_path / "tiny"}"\ndevice = "cpu"\n[train]\nmax_steps = 1\n'
                    "[rollout]\nprompts_per_step = 2\ngroup_size = 4\n[eval]\nlimit = 4\npass_k = 0\n"
                    "[log]\ntensorboard = false\n")
    more.write_text("[rollout]\ngroup_size = 2\n")
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--config", str(base), "--config", str(more)]) == 0
    recorded = tomllib.loads((run / "config.toml").read_text())
    assert recorded["rollout"]["group_size"] == 2 and recorded["rollout"]["prompts_per_step"] == 2
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--set", "train.max_steps=2"]) == 0
    assert f"resuming {run} from step 1" in capsys.readouterr().out
