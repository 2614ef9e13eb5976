"""nccl sync's code path over gloo on CPU, with 2 processes: this one hosts the server (rank 1), a child process is
the trainer (rank 0) and pushes through NcclSync in buckets; the served weights' checksum is the trainer's. A second
push that dies halfway through its buckets leaves the first one served."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import torch

pytest.importorskip("openai")

from tests.serve.conftest import child_env, serve_config, start_server  # noqa: E402
from tests.tests_support.ports import free_port  # noqa: E402

TRAINER = textwrap.dedent("""
    import os, sys, threading, torch
    from transformers import AutoModelForCausalLM
    from tandemrl.sync.buckets import filled_buckets, layout
    from tandemrl.sync.checksum import weights_checksum
    from tandemrl.sync.client import ServerClient
    from tandemrl.sync import nccl

    model_dir, url, init_method = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    sync = nccl.NcclSync(ServerClient(url), init_method, backend="gloo", timeout_s=60, bucket_mb=BUCKET_MB)
    report = sync.push(model, 1)
    print("pushed", report.bytes, flush=True)
    print("checksum", weights_checksum(nccl.named_weights(model)), flush=True)
    # the second push announces every tensor, sends half of its buckets and dies
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    specs = nccl.parameter_specs(model)
    body = {"version": 2, "tensors": specs, "bucket_bytes": sync.bucket_bytes}
    threading.Thread(target=lambda: ServerClient(url).post("/v1/weights/nccl/push", body), daemon=True).start()
    segments, total = layout(specs)
    weights = nccl.named_weights(model)
    buckets = -(-total // sync.bucket_bytes)
    assert buckets >= 4, buckets
    for i, bucket in enumerate(filled_buckets(segments, total, lambda i: weights[i][1], sync.bucket_bytes,
                                              torch.device("cpu"))):
        if i == buckets // 2:
            break
        sync.group.broadcast(bucket)
    os._exit(3)
""").replace("BUCKET_MB", "0.05")  # the tiny model's 0.3 MB in 7 buckets


def test_nccl_sync_over_gloo_and_an_interrupted_push(tiny_dir):
    from tandemrl.models.lora import unwrap_causal_lm
    from tandemrl.sync.checksum import weights_checksum
    from tandemrl.sync.nccl import named_weights
    from transformers import AutoModelForCausalLM

    running = start_server(serve_config(tiny_dir))
    try:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        env = child_env()
        child = subprocess.run([sys.executable, "-c", TRAINER, str(tiny_dir), running.url, init_method],
                               capture_output=True, text=True, env=env, timeout=120)
        assert child.returncode == 3, child.stderr[-3000:]
        assert "pushed" in child.stdout
        checksum = child.stdout.split("checksum ")[1].split()[0]
        expected = {n: p * 1.5 for n, p in AutoModelForCausalLM.from_pretrained(str(tiny_dir)).named_parameters()}
        served = dict(unwrap_causal_lm(running.state.weights.model).named_parameters())
        assert served.keys() == expected.keys()
        for name, tensor in served.items():
            torch.testing.assert_close(tensor.detach(), expected[name].detach(), rtol=0, atol=0)
        # the server's checksum of what it serves is the trainer's, and not that of the weights it started from
        served_checksum = httpx.get(running.url + "/v1/weights/checksum", timeout=30).json()["checksum"]
        assert served_checksum == checksum
        start = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
        assert weights_checksum(named_weights(start)) != checksum
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
