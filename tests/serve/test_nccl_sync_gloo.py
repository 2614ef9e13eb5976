"""nccl sync's code path over gloo on CPU, with 2 processes: this one hosts the server (rank 1), a child process is
the trainer (rank 0) and pushes through NcclSync. A second push that dies halfway leaves the first one served."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import torch
import torch.distributed as dist

pytest.importorskip("openai")

from tests.serve.conftest import child_env, serve_config, start_server  # noqa: E402

TRAINER = textwrap.dedent("""
    import os, sys, torch
    from transformers import AutoModelForCausalLM
    from tandemrl.sync.client import ServerClient
    from tandemrl.sync import nccl

    model_dir, url, init_method = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    sync = nccl.NcclSync(ServerClient(url), init_method, backend="gloo", timeout_s=60)
    report = sync.push(model, 1)
    print("pushed", report.bytes, flush=True)
    # the second push announces every tensor, sends half of them and dies
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    specs = nccl.parameter_specs(model)
    import threading
    threading.Thread(target=lambda: ServerClient(url).post("/v1/weights/nccl/push",
                                                            {"version": 2, "tensors": specs}), daemon=True).start()
    import torch.distributed as dist
    for name, p in nccl._parameters(model)[: len(specs) // 2]:
        dist.broadcast(p.detach().contiguous(), src=0)
    os._exit(3)
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nccl_sync_over_gloo_and_an_interrupted_push(tiny_dir):
    from tandemrl.models.lora import unwrap_causal_lm
    from transformers import AutoModelForCausalLM

    running = start_server(serve_config(tiny_dir))
    try:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        env = child_env()
        child = subprocess.run([sys.executable, "-c", TRAINER, str(tiny_dir), running.url, init_method],
                               capture_output=True, text=True, env=env, timeout=120)
        assert child.returncode == 3, child.stderr[-3000:]
        assert "pushed" in child.stdout
        expected = {n: p * 1.5 for n, p in AutoModelForCausalLM.from_pretrained(str(tiny_dir)).named_parameters()}
        served = dict(unwrap_causal_lm(running.state.weights.model).named_parameters())
        assert served.keys() == expected.keys()
        for name, tensor in served.items():
            torch.testing.assert_close(tensor.detach(), expected[name].detach(), rtol=0, atol=0)
        deadline = time.monotonic() + 30
        status = httpx.get(running.url + "/v1/weights", timeout=30).json()
        while status["last_push"]["version"] != 2 and time.monotonic() < deadline:  # the server sees the break
            time.sleep(0.1)
            status = httpx.get(running.url + "/v1/weights", timeout=30).json()
        assert status["policy_version"] == 1  # the broken second push changed nothing
        assert status["last_push"]["ok"] is False and "still serving policy version 1" in status["last_push"]["error"]
        assert status["last_push"]["kind"] == "nccl" and status["pushes"] == 1
    finally:
        running.stop()
        if dist.is_initialized():
            dist.destroy_process_group()
