"""Environments (Atropos-style) drive the server and push scored groups to the trainer: rollout.env_port."""

from __future__ import annotations

import io
import json
import threading
import time

import httpx
import pytest
from rich.console import Console

pytest.importorskip("openai")

from tandemrl.config import config_to_toml, validate_config  # noqa: E402
from tandemrl.envs.__main__ import main as envs_main  # noqa: E402
from tandemrl.envs.runner import run_environment  # noqa: E402
from tandemrl.train.group_receiver import GroupReceiver  # noqa: E402
from tandemrl.train.rollout_queue import RolloutQueue  # noqa: E402
from tandemrl.train.loop import train  # noqa: E402
from tests.serve.conftest import serve_config, start_server  # noqa: E402
from tests.serve.test_trainer_against_server import trainer_config  # noqa: E402
from tests.tests_support.ports import free_port  # noqa: E402


def test_two_environments_feed_the_trainer_through_the_server(tiny_dir, tmp_path):
    running = start_server(serve_config(tiny_dir))
    port = free_port()
    try:
        raw = trainer_config(tiny_dir, running.url, "checkpoint")
        raw["rollout"].update(mode="async", max_staleness=1, env_port=port)
        raw["train"]["max_steps"] = 3
        cfg = validate_config(raw)
        stop, reports = threading.Event(), {}

        def environment(name: str, seed: int) -> None:
            reports[name] = run_environment(cfg, f"http://127.0.0.1:{port}", name, seed, stop)

        config_file = tmp_path / "run.toml"
        config_file.write_text(config_to_toml(cfg))
        command_line = ["--trainer", f"http://127.0.0.1:{port}", "--config", str(config_file), "--name", "env1",
                        "--seed", "1"]  # the other one as `python -m tandemrl.envs` runs it
        envs = [threading.Thread(target=environment, args=("env0", 0)),
                threading.Thread(target=lambda: reports.setdefault("env1", envs_main(command_line)))]
        for thread in envs:
            thread.start()
        train(cfg, tmp_path / "run", console=Console(file=io.StringIO()))
        for thread in envs:
            thread.join(timeout=60)  # the trainer said it finished: they stop on their own
            assert not thread.is_alive()
        assert reports["env1"] == 0 and "env0" in reports  # both ran to the end: the trainer took 3 x 2 groups
        rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "loss" in r]
        assert [r["policy_version"] for r in steps] == [1, 2, 3]
        assert all(r["async/version_lag_max"] <= 1 for r in steps)
        samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == 3 * 2 * 4  # whole groups of rollout.group_size, rollout.prompts_per_step a step
        for row in samples:  # the server's version that sampled it, at most one update behind its step
            assert row["step"] - 2 <= row["policy_version"] <= row["step"] - 1
        assert running.state.policy_version == 3
    finally:
        stop.set()
        running.stop()


def test_a_malformed_group_is_refused_naming_the_field_and_a_full_queue_says_so():
    receiver = GroupReceiver(RolloutQueue(capacity_groups=1), max_staleness=0)
    try:
        group = {"prompt_ids": [1, 2], "rewards": [1.0, 0.0], "completions": [
            {"token_ids": [3], "logprobs": [-0.1], "policy_version": 0},
            {"token_ids": [4, 5], "logprobs": [-0.2], "policy_version": 0}]}
        bad = httpx.post(f"{receiver.url}/groups", json=group)
        assert bad.status_code == 400 and "completions[1].logprobs: 2 numbers" in bad.json()["error"]
        group["completions"][1]["logprobs"] = [-0.2, -0.3]
        assert httpx.post(f"{receiver.url}/groups", json=group).status_code == 200
        full = httpx.post(f"{receiver.url}/groups", json=group)
        assert full.status_code == 503 and full.json()["queue_groups"] == 1
        status = httpx.get(f"{receiver.url}/status").json()
        assert status == {"trainer_version": 0, "queue_groups": 1, "capacity_groups": 1, "max_staleness": 0,
                          "groups_received": 1, "finished": False}
    finally:
        receiver.stop()


def test_environments_that_went_quiet_are_reported_once_and_a_new_one_is_taken(capsys):
    """Environments are processes of their own: when none reaches the trainer while it waits, it says so (once per
    silence) and keeps waiting for any environment started in their place."""
    receiver = GroupReceiver(RolloutQueue(capacity_groups=1), max_staleness=0)
    try:
        receiver.silent_s = 0.05
        assert receiver.gone() is None and capsys.readouterr().out == ""  # not quiet long enough yet
        time.sleep(0.1)
        assert receiver.gone() is None and receiver.gone() is None
        out = capsys.readouterr().out
        assert out.count("no environment has reached") == 1 and "python -m tandemrl.envs --trainer" in out
        httpx.get(f"{receiver.url}/status")  # a replacement checks in
        assert receiver.gone() is None and capsys.readouterr().out == ""
        time.sleep(0.1)
        assert receiver.gone() is None and "no environment has reached" in capsys.readouterr().out
    finally:
        receiver.stop()


def test_an_environment_runs_the_tool_calling_agent_loop_against_the_server(tiny_dir, tmp_path, monkeypatch):
    """synthetic:peek through an environment: each turn a request to the server, the tool's result inserted and
    kept out of the loss, the group scored and pushed; the trainer takes it as it takes single-turn groups."""
    import tandemrl.envs.runner as runner

    running = start_server(serve_config(tiny_dir))
    port = free_port()
    try:
        raw = trainer_config(tiny_dir, running.url, "checkpoint")
        raw["data"] = {"task": "synthetic:peek"}
        raw["rollout"].update(mode="async", max_staleness=1, env_port=port, temperature=0.0, max_tokens=1)
        raw["tools"] = {"call_open": ":"}  # the tiny model repeats the prompt's last character: "peek:" calls at once
        raw["train"]["max_steps"] = 2
        cfg = validate_config(raw)
        pushed, real_push = [], runner._push
        monkeypatch.setattr(runner, "_push", lambda trainer, scored, *rest: pushed.append(scored)
                            or real_push(trainer, scored, *rest))
        trainer = threading.Thread(target=train, args=(cfg, tmp_path / "run"),
                                   kwargs={"console": Console(file=io.StringIO())}, daemon=True)
        trainer.start()
        run_environment(cfg, f"http://127.0.0.1:{port}", "env0", 0)  # until the trainer finishes
        trainer.join(timeout=60)
        assert not trainer.is_alive() and pushed
        for scored in pushed:
            for trajectory, rollout in zip(scored.trajectories, scored.rollouts):
                assert [c.name for c in trajectory.tool_calls] == ["peek"] and trajectory.turns == 2
                inserted = trajectory.inserted_tokens
                assert rollout.loss_weights == [1.0] + [0.0] * inserted + [1.0]  # the call, "=d", the answer
                assert len(rollout.logprobs) == len(rollout.completion_ids) == inserted + 2
                assert 0 <= rollout.policy_version <= running.state.policy_version
        rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["policy_version"] for r in rows if "loss" in r] == [1, 2]
        samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == 2 * 2 * 4 and all(row["reward/tool_use"] > 0 for row in samples)
        assert all(row["correct"] == 1 for row in samples)  # the tool's digit, repeated: the answer
    finally:
        running.stop()
