"""Tools in the trainer: the synthetic tool task end to end (short), the batch's loss mask, the config's errors and
the task's own defaults."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import torch

from tandemrl.config import ConfigError, config_to_toml, load_config
from tandemrl.train.batch import build_batch
from tandemrl.train.loop import train
from tandemrl.types import Rollout


def test_tool_task_trains_with_its_own_defaults_and_logs_tool_metrics(tmp_path):
    # Only sizes and where files go: the tool setup, turn budget and reward weights are the task's defaults.
    cfg = load_config(None, [
        f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "data.task=synthetic:peek", "train.max_steps=3",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "eval.limit=4", "eval.pass_k=0",
        "log.tensorboard=false",
    ])
    summary = train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 3 and summary["steps"] == 3
    for key in ("tools/calls_per_traj", "tools/errors", "tools/turns_per_traj", "tools/reprefill_tokens_per_traj",
                "reward/tool_use/mean"):
        assert key in steps[-1], key
    assert all(0 <= r["tools/calls_per_traj"] <= 1 for r in steps)  # the task allows one call
    written = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert written["tools"]["names"] == ["peek"] and written["reward"]["weights"]["tool_use"] == 0.5


def test_task_defaults_fill_only_the_keys_the_user_left_out(tmp_path):
    cfg = load_config(None, ["data.task=synthetic:peek"])
    assert cfg.tools.active and cfg.tools.names == ["peek"] and cfg.tools.format == "plain"
    assert (cfg.tools.call_open, cfg.tools.call_close, cfg.tools.max_tool_calls) == ("?", "", 1)
    assert cfg.rollout.max_tokens == 1 and cfg.reward.weights == {"accuracy": 1.0, "tool_use": 0.5}
    assert cfg.train.max_steps == 250
    path = tmp_path / "resolved.toml"  # the resolved config says what was used, and reloads to the same config
    path.write_text(config_to_toml(cfg))
    assert load_config(path) == cfg
    mine = load_config(None, ["data.task=synthetic:peek", "rollout.max_tokens=3", "reward.weights={accuracy=1.0}"])
    assert mine.rollout.max_tokens == 3 and mine.reward.weights == {"accuracy": 1.0}
    assert mine.tools.names == ["peek"]  # the keys not set still come from the task
    plain = load_config(None, [])  # other tasks: no tools, the section's own defaults
    assert not plain.tools.active and plain.tools.format == "hermes" and plain.rollout.max_tokens == 3


def test_inserted_tokens_are_out_of_the_loss():
    rollout = Rollout("t", [5, 6], [7, 8, 9, 10], [-1.0, 0.0, 0.0, -2.0], "stop", loss_weights=[1.0, 0.0, 0.0, 1.0])
    batch = build_batch([rollout], torch.zeros(1), pad_id=0, device=torch.device("cpu"))
    assert batch.loss_mask.tolist() == [[1.0, 0.0, 0.0, 1.0]]


@pytest.mark.parametrize("overrides, message", [
    (["data.task=synthetic:peek", 'rollout.backend="hf"'],
     "tools (multi-turn rollouts) need rollout.backend = 'engine'"),
    (["data.task=synthetic:peek", "tandem.enabled=true"], "tools cannot be combined with tandem"),
    (["tools.enabled=true", 'tools.format="xml"'], "tools.format"),
    (['tools.names=["peek"]', 'tools.call_open=""'], "tools.call_open"),
    (["tools.enabled=true"], "tools.enabled = true but tools.names is empty"),
    (['tools.names=["calc"]'], "tools.names: unknown tool 'calc'; built-in tools: python, calculator, peek; or your "
     "own as 'package.module:function' or 'path/to/file.py:function'"),
    (['tools.names=["calculater"]'], "unknown tool 'calculater' (did you mean 'calculator'?)"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_tools_are_off_by_default_and_on_for_the_tool_task():
    assert not load_config(None, []).tools.active
    assert load_config(None, ["data.task=synthetic:peek"]).tools.active
    assert not load_config(None, ["data.task=synthetic:peek", "tools.enabled=false"]).tools.active
    assert load_config(None, ['tools.names=["calculator"]']).tools.active
