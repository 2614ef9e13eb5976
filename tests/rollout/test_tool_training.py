"""Tools in the trainer: the synthetic tool task end to end (short), the batch's loss mask, the config's errors."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tandemrl.config import ConfigError, load_config
from tandemrl.train.batch import build_batch
from tandemrl.train.loop import train
from tandemrl.types import Rollout


def test_tool_task_trains_and_logs_tool_metrics(tmp_path):
    cfg = load_config(None, [
        f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "data.task=synthetic:peek", "train.max_steps=3",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_tokens=2", "eval.limit=4",
        "eval.pass_k=0", "log.tensorboard=false", "reward.weights={accuracy=1.0, tool_use=0.5}",
    ])
    summary = train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 3 and summary["steps"] == 3
    for key in ("tools/calls_per_traj", "tools/errors", "tools/turns_per_traj", "tools/reprefill_tokens_per_traj",
                "reward/tool_use/mean"):
        assert key in steps[-1], key
    assert all(0 <= r["tools/calls_per_traj"] <= 1 for r in steps)  # the task allows one call


def test_inserted_tokens_are_out_of_the_loss():
    rollout = Rollout("t", [5, 6], [7, 8, 9, 10], [-1.0, 0.0, 0.0, -2.0], "stop", loss_weights=[1.0, 0.0, 0.0, 1.0])
    batch = build_batch([rollout], torch.zeros(1), pad_id=0, device=torch.device("cpu"))
    assert batch.loss_mask.tolist() == [[1.0, 0.0, 0.0, 1.0]]


@pytest.mark.parametrize("overrides, message", [
    (["data.task=synthetic:peek", 'rollout.backend="hf"'],
     "tools (multi-turn rollouts) need rollout.backend = 'engine'"),
    (["data.task=synthetic:peek", "tandem.enabled=true"], "tools cannot be combined with tandem"),
    (["tools.enabled=true", 'tools.format="xml"'], "tools.format"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_tools_are_off_by_default_and_on_for_the_tool_task():
    from tandemrl.rollout.setup import tools_enabled

    assert not tools_enabled(load_config(None, []))
    assert tools_enabled(load_config(None, ["data.task=synthetic:peek"]))
    assert not tools_enabled(load_config(None, ["data.task=synthetic:peek", "tools.enabled=false"]))
    assert tools_enabled(load_config(None, ['tools.names=["calculator"]']))
