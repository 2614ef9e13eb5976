"""The embedded default learns: `tandemrl train` with no arguments, on a CPU, fixed seed."""

import json

from tandemrl.config import load_config
from tandemrl.data.synthetic import synthetic_chance_accuracy
from tandemrl.train.loop import train


def test_the_default_run_learns_far_above_chance(tmp_path):
    # Exactly the defaults, except where files go and TensorBoard (not what is tested).
    cfg = load_config(None, [f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "log.tensorboard=false"])
    summary = train(cfg, tmp_path / "run")
    chance = synthetic_chance_accuracy("add")
    assert summary["initial"]["accuracy"] <= 2 * chance
    assert summary["final"]["accuracy"] >= 3 * chance
    assert summary["final"]["accuracy"] >= summary["initial"]["accuracy"] + 0.2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == cfg.train.max_steps
