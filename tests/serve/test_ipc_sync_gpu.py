"""ipc sync on one GPU, two processes: the server (this process) maps the trainer's (a child's) parameters through
CUDA IPC handles; its own copy is freed (one copy of the weights in GPU memory), and the trainer's in-place writes
are what it computes with after a version-only push."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("openai")

from tests.serve.conftest import serve_config, start_server  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

TRAINER = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM
    from tandemrl.serve.client import ServerClient
    from tandemrl.sync.ipc import IpcSync

    model_dir, url = sys.argv[1:3]
    model = AutoModelForCausalLM.from_pretrained(model_dir).cuda()
    sync = IpcSync(ServerClient(url))
    print("attach", sync.push(model, 1).seconds, flush=True)
    sys.stdin.readline()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)  # in place: the server's view changes with it
    print("bump", sync.push(model, 2).seconds, flush=True)
    sys.stdin.readline()  # keep the memory alive until the server is done with it
""")


def test_ipc_one_copy_and_in_place_updates(tiny_dir):
    from tandemrl.models.lora import unwrap_causal_lm
    from transformers import AutoModelForCausalLM

    raw = serve_config(tiny_dir)
    raw["model"]["device"] = "cuda"
    running = start_server(raw, allow_ipc=True)
    child = None
    try:
        model = running.state.weights.model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        child = subprocess.Popen([sys.executable, "-c", TRAINER, str(tiny_dir), running.url], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = child.stdout.readline()
        assert line.startswith("attach"), child.stderr.read()[-3000:]
        torch.cuda.synchronize()
        freed = before - torch.cuda.memory_allocated()
        assert freed >= 0.9 * weight_bytes  # the server's own copy is gone: the weights exist once
        base = {n: p.detach().cuda() for n, p in
                AutoModelForCausalLM.from_pretrained(str(tiny_dir)).named_parameters()}
        served = dict(unwrap_causal_lm(model).named_parameters())
        for name, p in served.items():
            torch.testing.assert_close(p.detach(), base[name], rtol=0, atol=0)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().startswith("bump")
        for name, p in served.items():  # no bytes were sent: the trainer's in-place write is visible here
            torch.testing.assert_close(p.detach(), base[name] * 2, rtol=0, atol=0)
        assert running.state.policy_version == 2
    finally:
        if child is not None:
            child.stdin.write("exit\n")
            child.stdin.flush()
            child.wait(30)
        running.stop()
