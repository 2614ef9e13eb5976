"""What a run leaves in --out: nothing when setup fails; summary.json's seconds span every resume."""

import json
import signal
import time

import pytest

import tandemrl.train.loop as loop
from tandemrl.cli import main
from tandemrl.config import load_config
from tandemrl.train.checkpoint import find_latest
from tandemrl.train.loop import train


@pytest.mark.parametrize("bad, message", [
    ("data.task=\"nonsense\"", "unknown task 'nonsense'"),
    ("data.path=\"/nowhere/gsm8k.jsonl\"", "no such file or directory: /nowhere/gsm8k.jsonl"),
    ("model.name_or_path=\"/nowhere/model\"", "/nowhere/model does not exist"),
])
def test_setup_errors_write_nothing_to_out(tmp_path, capsys, bad, message):
    out = tmp_path / "run"
    extra = ["--set", "data.task=\"gsm8k\""] if "data.path" in bad else []
    code = main(["train", "--out", str(out), "--set", f'model.tiny_dir="{tmp_path / "tiny"}"',
                 "--set", "log.tensorboard=false", *extra, "--set", bad])
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()  # no config.toml, not even the directory


def test_summary_seconds_count_the_whole_run_across_resumes(tmp_path, monkeypatch):
    cfg = load_config(None, [
        f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "train.max_steps=3", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "eval.limit=4", "eval.pass_k=0", "checkpoint.every_steps=0", "log.tensorboard=false",
    ])
    real_step = loop.train_step

    def slow_then_interrupted(run, state, display):
        time.sleep(1.5)  # the first part of the run takes longer than all of the resumed part
        signal.raise_signal(signal.SIGINT)
        return real_step(run, state, display)

    monkeypatch.setattr(loop, "train_step", slow_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run")
    saved = json.loads((find_latest(tmp_path / "run" / "checkpoints") / "trainer_state.json").read_text())
    assert saved["step"] == 1 and saved["seconds"] >= 1.5
    monkeypatch.setattr(loop, "train_step", real_step)
    began = time.perf_counter()
    summary = train(cfg, tmp_path / "run", resume=True)
    resumed_part = time.perf_counter() - began
    assert saved["seconds"] + 0.05 <= summary["seconds"] <= saved["seconds"] + resumed_part + 0.05
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["seconds"] == summary["seconds"]
