"""The server's half of an ipc push, on the CPU: between two engine steps the engine sleeps, the served parameters
are pointed at other tensors (in a real push, the trainer's memory opened from CUDA IPC handles) and the engine
wakes and decodes from them. The GPU test (test_ipc_sync_gpu.py) adds the handles and the second process."""

from __future__ import annotations

import httpx
import torch

from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.serve.weights_routes import _attach
from tandemrl.sync.ipc import _parameters
from tests.serve.conftest import MODEL_NAME, serve_config, start_server


def greedy(url: str) -> tuple[list[int], list[float]]:
    """Greedy token ids and their log-probs (the tiny model repeats itself: the log-probs show a weight change)."""
    body = {"model": MODEL_NAME, "prompt": [3, 4, 5, 6], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "logprobs": 1}
    response = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def test_attach_between_steps_decodes_from_the_new_tensors(tiny_dir):
    running = start_server(serve_config(tiny_dir))
    try:
        model, receiver = running.state.weights.model, running.state.weights
        before = greedy(running.url)
        shared = {name: p.detach().clone() for name, p in _parameters(model)}
        receiver.set_version("ipc", 1, lambda: _attach(running.state, shared))
        served = dict(unwrap_causal_lm(model).named_parameters())
        assert all(served[name].data_ptr() == t.data_ptr() for name, t in shared.items())  # mapped, not copied
        assert greedy(running.url) == before  # same values, new memory: the engine woke up on it
        with torch.no_grad():  # the trainer's in-place step, then a version-only push
            shared["model.embed_tokens.weight"].mul_(0.5)
        receiver.set_version("ipc", 2)
        assert running.state.policy_version == 2
        assert greedy(running.url)[1] != before[1]
    finally:
        running.stop()
