"""rollout.mode = "async" against a server: the rollout worker sends each batch to `tandemrl serve` while the
trainer updates, the trainer's sync.kind pushes every new version there, and each rollout carries the version the
server sampled it with."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

pytest.importorskip("openai")

from tandemrl.config import validate_config  # noqa: E402
from tandemrl.train.loop import train  # noqa: E402
from tests.serve.conftest import serve_config, start_server  # noqa: E402
from tests.serve.test_trainer_against_server import trainer_config  # noqa: E402


@pytest.mark.parametrize("staleness", [0, 1])
def test_async_training_against_a_server(tiny_dir, tmp_path, staleness):
    running = start_server(serve_config(tiny_dir))
    try:
        raw = trainer_config(tiny_dir, running.url, "checkpoint")
        raw["rollout"].update(mode="async", max_staleness=staleness)
        raw["train"]["max_steps"] = 4
        train(validate_config(raw), tmp_path / "run", console=Console(file=io.StringIO()))
        rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "loss" in r]
        assert [r["policy_version"] for r in steps] == [1, 2, 3, 4]
        assert all(r["async/version_lag_max"] <= staleness and r["async/dropped_groups"] == 0 for r in steps)
        if staleness == 0:  # every batch sampled by the weights of the step that uses it
            assert all(r["mismatch/policy_version_lag"] == 0 for r in steps)
        samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
        for row in samples:  # the server's version, at most `staleness` updates behind the step that used it
            assert row["step"] - 1 - staleness <= row["policy_version"] <= row["step"] - 1
        assert running.state.policy_version == 4  # the last push reached the server
    finally:
        running.stop()


def test_async_training_against_a_server_runs_the_tools_turn_by_turn(tiny_dir, tmp_path):
    """Tools on, no environments: the worker's agent loop sends each turn to the server (it was single-turn, the
    tools unused, before); the tool's tokens stay out of the loss."""
    running = start_server(serve_config(tiny_dir))
    try:
        raw = trainer_config(tiny_dir, running.url, "checkpoint")
        raw["data"] = {"task": "synthetic:peek"}
        raw["rollout"].update(mode="async", max_staleness=1, temperature=0.0, max_tokens=1)
        raw["tools"] = {"call_open": ":"}  # the tiny model repeats the prompt's last character: "peek:" calls at once
        raw["train"]["max_steps"] = 2
        train(validate_config(raw), tmp_path / "run", console=Console(file=io.StringIO()))
        samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
        assert samples and all(row["reward/tool_use"] > 0 for row in samples)
        assert all(row["correct"] == 1 for row in samples)  # the tool's digit, repeated: the answer
    finally:
        running.stop()
