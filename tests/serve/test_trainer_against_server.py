"""The trainer with rollout.backend = "server": rollouts from a separate server, weights pushed after each update
(checkpoint and lora sync), the policy version on every rollout, staleness refused."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

pytest.importorskip("openai")

from tandemrl.config import validate_config  # noqa: E402
from tandemrl.models.lora import unwrap_causal_lm  # noqa: E402
from tandemrl.telemetry.progress import TrainDisplay  # noqa: E402
from tandemrl.train.loop import train, train_step  # noqa: E402
from tandemrl.train.setup import TrainerState, build_run  # noqa: E402
from tests.serve.conftest import serve_config, start_server  # noqa: E402

LORA = {"enabled": True, "rank": 4, "alpha": 8}


def trainer_config(tiny_dir, url: str, kind: str, **model) -> dict:
    return {"model": {"name_or_path": str(tiny_dir), "device": "cpu", **model},
            "rollout": {"backend": "server", "server_url": url, "prompts_per_step": 2, "group_size": 4,
                        "max_tokens": 3, "server_backoff_s": 0.05, "server_retries": 1},
            "sync": {"kind": kind}, "train": {"max_steps": 2, "lr": 1e-2, "weight_decay": 0.5}, "eval": {"limit": 4, "pass_k": 0},
            "checkpoint": {"every_steps": 0}, "log": {"tensorboard": False}}


def quiet_display() -> TrainDisplay:
    return TrainDisplay(10, 0, Console(file=io.StringIO()))


def served_base(running) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in unwrap_causal_lm(running.state.weights.model).named_parameters()
            if "lora_" not in n}


def test_training_with_checkpoint_sync(tiny_dir, tmp_path):
    running = start_server(serve_config(tiny_dir))
    try:
        cfg = validate_config(trainer_config(tiny_dir, running.url, "checkpoint"))
        summary = train(cfg, tmp_path / "run", console=Console(file=io.StringIO()))
        assert summary["steps"] == 2
        rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "loss" in r]
        assert [r["policy_version"] for r in steps] == [1, 2]
        assert all(r["sync/mb"] > 0 and r["mismatch/policy_version_lag"] == 0 for r in steps)
        assert running.state.policy_version == 2
        # the server computes with the trainer's final weights (the run's last checkpoint)
        from tandemrl.train.checkpoint import find_latest
        from safetensors.torch import load_file

        saved = load_file(str(find_latest(tmp_path / "run" / "checkpoints") / "model.safetensors"))
        served = served_base(running)
        for name, tensor in served.items():
            torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0)
        base = {n: p for n, p in unwrap_causal_lm(_fresh(tiny_dir)).named_parameters()}
        changed = sum(not torch.equal(served[n], base[n]) for n in served)
        assert changed > 0  # training moved the weights, and the server has them
    finally:
        running.stop()


def _fresh(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir))


def test_training_with_lora_sync_pushes_only_the_adapter(tiny_dir, tmp_path):
    running = start_server({**serve_config(tiny_dir), "model": {"name_or_path": str(tiny_dir), "device": "cpu",
                                                                "lora": LORA}})
    try:
        base_before = served_base(running)
        cfg = validate_config(trainer_config(tiny_dir, running.url, "lora", lora=LORA))
        run = build_run(cfg, tmp_path / "run")
        state = TrainerState()
        run.sync.push(run.model, 0)
        initial = {n: p.detach().clone() for n, p in run.model.named_parameters() if "lora_" in n}
        display = quiet_display()
        metrics = [train_step(run, state, display) for _ in range(2)]
        assert running.state.policy_version == state.policy_version == 2
        adapter = {n: p for n, p in run.model.named_parameters() if "lora_" in n}
        served = {n: p for n, p in running.state.weights.model.named_parameters() if "lora_" in n}
        assert adapter.keys() == served.keys()
        for name in adapter:
            torch.testing.assert_close(served[name], adapter[name].detach(), rtol=0, atol=0)
        assert any(not torch.equal(served[n], initial[n]) for n in served)  # training moved the adapter
        adapter_mb = sum(p.numel() * 4 for p in adapter.values()) / 2**20
        assert metrics[-1]["sync/mb"] < 1.5 * adapter_mb  # the adapter travelled, not the model
        for name, tensor in served_base(running).items():
            assert torch.equal(tensor, base_before[name])  # the served base weights never changed
    finally:
        running.stop()


def test_staleness_is_refused_unless_allowed_or_resynced(tiny_dir, server):
    from tandemrl.backends.server_backend import ServerBackend, StaleRolloutError
    from tandemrl.types import Request, SamplingParams

    requests = [Request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=2)) for i in range(2)]
    version = server.state.policy_version
    strict = ServerBackend(server.url, max_staleness=0)
    assert [r.policy_version for r in strict.generate(requests, version)] == [version] * 2
    with pytest.raises(StaleRolloutError, match=f"policy version {version}.*trainer is at {version + 1}"):
        strict.generate(requests, version + 1)
    assert len(ServerBackend(server.url, max_staleness=1).generate(requests, version + 1)) == 2
    with pytest.raises(StaleRolloutError):  # a server ahead of the trainer is as wrong
        strict.generate(requests, version - 1)
    pushed = []
    strict.resync = pushed.append  # pretend: the push does not change the server, so it stays stale
    with pytest.raises(StaleRolloutError):
        strict.generate(requests, version + 1)
    assert pushed == [version + 1]
