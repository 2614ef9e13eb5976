"""ipc sync on one GPU, two processes: the server (this process) maps the trainer's (a child's) parameters through
CUDA IPC handles; its own copy is freed (one copy of the weights in GPU memory), and the trainer's in-place writes
are what it computes with after a version-only push."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import httpx
import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("openai")

from tests.serve.conftest import MODEL_NAME, child_env, serve_config, start_server  # noqa: E402

TRAINER = textwrap.dedent("""
    import sys, torch
    from tandemrl.models.load import load_model
    from tandemrl.sync.client import ServerClient
    from tandemrl.sync.ipc import IpcSync

    model_dir, url = sys.argv[1:3]
    model = load_model(model_dir, dtype="bfloat16", device="cuda")  # the server's dtype: handles must match
    sync = IpcSync(ServerClient(url))
    print("attach", sync.push(model, 1).seconds, flush=True)
    sys.stdin.readline()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)  # in place: the server's view changes with it
    print("bump", sync.push(model, 2).seconds, flush=True)
    sys.stdin.readline()  # keep the memory alive until the server is done with it
""")


def greedy_ids(url: str) -> list[int]:
    body = {"model": MODEL_NAME, "prompt": [3, 4, 5, 6], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    response = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def test_ipc_one_copy_and_in_place_updates(tiny_dir):
    from tandemrl.models.load import load_model
    from tandemrl.models.lora import unwrap_causal_lm
    from tandemrl.serve.weight_memory import owned_weight_bytes

    raw = serve_config(tiny_dir)
    raw["model"].update(device="cuda", dtype="bfloat16")
    running = start_server(raw, allow_ipc=True)
    child = None
    try:
        model = running.state.weights.model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert owned_weight_bytes(model) == weight_bytes
        own_weights_ids = greedy_ids(running.url)  # first: the engine's own allocations (graphs, workspaces) are made
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        child = subprocess.Popen([sys.executable, "-c", TRAINER, str(tiny_dir), running.url], env=child_env(),
                                 text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = child.stdout.readline()
        assert line.startswith("attach"), child.stderr.read()[-3000:]
        torch.cuda.synchronize()
        freed = before - torch.cuda.memory_allocated()
        assert freed >= 0.9 * weight_bytes  # the server's own copy is gone: the weights exist once
        assert owned_weight_bytes(model) == 0  # what /metrics reports as weight_bytes_owned
        base = dict(load_model(str(tiny_dir), dtype="bfloat16", device="cuda").named_parameters())
        served = dict(unwrap_causal_lm(model).named_parameters())
        for name, p in served.items():
            torch.testing.assert_close(p.detach(), base[name].detach(), rtol=0, atol=0)
        assert greedy_ids(running.url) == own_weights_ids  # the engine decodes from the mapped memory
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().startswith("bump")
        for name, p in served.items():  # no bytes were sent: the trainer's in-place write is visible here
            torch.testing.assert_close(p.detach(), base[name].detach() * 2, rtol=0, atol=0)
        assert running.state.policy_version == 2
        assert len(greedy_ids(running.url)) == 8
    finally:
        try:
            running.stop()  # first: the server must not compute on the trainer's memory once it exits
        finally:
            if child is not None:
                child.communicate("exit\n", timeout=30)  # a child that already died is fine here
