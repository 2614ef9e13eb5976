"""Weight pushes into a running server: a LoRA swap lands between steps without dropping requests and changes what
the server generates; an incomplete or damaged push is refused and the server keeps its last complete version."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from tandemrl.sync.client import ServerClient, ServerError  # noqa: E402
from tandemrl.sync.checkpoint import CheckpointSync, save_checkpoint  # noqa: E402
from tandemrl.sync.lora import LoraSync, adapter_tensors  # noqa: E402
from tests.serve.conftest import MODEL_NAME, serve_config, start_server  # noqa: E402

LORA = {"enabled": True, "rank": 4, "alpha": 8}


@pytest.fixture(scope="module")
def lora_server(tiny_dir):
    running = start_server({**serve_config(tiny_dir), "model": {"name_or_path": str(tiny_dir), "device": "cpu",
                                                                "lora": LORA}})
    yield running
    running.stop()


def greedy_ids(url: str, prompt: str = "7+1=") -> list[int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    return out.choices[0].model_extra["token_ids"]


def trainer_lora_model(tiny_dir):
    from tandemrl.models.lora import LoraSettings, apply_lora
    from transformers import AutoModelForCausalLM

    return apply_lora(AutoModelForCausalLM.from_pretrained(str(tiny_dir)), LoraSettings(rank=4, alpha=8))


def test_lora_swap_between_steps_keeps_requests_and_changes_outputs(tiny_dir, lora_server):
    url = lora_server.url
    model = trainer_lora_model(tiny_dir)
    sync = LoraSync(ServerClient(url))
    with torch.no_grad():
        for name, tensor in adapter_tensors(model).items():
            tensor.zero_()  # B = 0 and A = 0: the adapter adds nothing
    sync.push(model, 1)
    base = greedy_ids(url)
    # a long stream is running while the adapter changes
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.completions.create(model=MODEL_NAME, prompt="2+2=", max_tokens=300, stream=True,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    chunks = [next(stream)]
    torch.manual_seed(0)
    with torch.no_grad():
        for tensor in adapter_tensors(model).values():
            tensor.normal_(0, 0.5)
    hold = threading.Event()
    lora_server.state.loop.between_steps(hold.wait)  # the engine waits here, the stream still running
    pushed: list = []
    pusher = threading.Thread(target=lambda: pushed.append(sync.push(model, 2)))
    pusher.start()
    deadline = time.monotonic() + 20
    while lora_server.state.loop._commands.qsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # until the push is queued behind the hold
    hold.set()  # the push lands before the next step
    pusher.join(30)
    report = pushed[0]
    chunks += list(stream)
    assert sum(len(c.choices[0].model_extra.get("token_ids", [])) for c in chunks) == 300  # not dropped
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[0].model_extra["policy_version"] == 1  # it started under version 1 ...
    assert chunks[-1].choices[0].model_extra["policy_version_last"] == 2  # ... and finished under version 2
    (first, old), (split, new) = chunks[-1].choices[0].model_extra["version_runs"]  # every token's version
    assert (first, old, new) == (0, 1, 2) and 1 <= split < 300
    assert report.bytes < 100_000  # only the adapter travelled
    assert greedy_ids(url) != base  # the new adapter is what the server computes with
    status = httpx.get(url + "/v1/weights").json()
    assert status["policy_version"] == 2 and status["last_push"]["ok"]


def test_a_truncated_lora_push_is_refused_and_the_last_version_served(tiny_dir, lora_server):
    url = lora_server.url
    model = trainer_lora_model(tiny_dir)
    LoraSync(ServerClient(url)).push(model, 10)
    before = greedy_ids(url)
    from tandemrl.sync.lora import encode_adapter

    payload = encode_adapter(model)
    client = ServerClient(url)
    with pytest.raises(ServerError, match="not applied.*still serving policy version 10") as err:
        client.post("/v1/weights/lora", content=payload[: len(payload) // 2], params={"version": 11})
    assert err.value.status == 409
    tensors = adapter_tensors(model)
    from safetensors.torch import save

    partial = save({n: t.contiguous() for n, t in list(tensors.items())[:3]})
    with pytest.raises(ServerError, match="incomplete push"):
        client.post("/v1/weights/lora", content=partial, params={"version": 11})
    status = httpx.get(url + "/v1/weights").json()
    assert status["policy_version"] == 10 and not status["last_push"]["ok"]
    assert "still serving policy version 10" in status["last_push"]["error"]
    assert greedy_ids(url) == before
    assert httpx.get(url + "/health").headers["x-policy-version"] == "10"


def test_checkpoint_push_and_a_damaged_checkpoint(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    running = start_server(serve_config(tiny_dir))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
        before = greedy_ids(running.url)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)
        report = CheckpointSync(ServerClient(running.url), tmp_path / "sync").push(model, 1)
        assert report.bytes > 0 and running.state.policy_version == 1
        changed = greedy_ids(running.url)
        assert changed != before
        # a damaged save: the file cut in half
        path = save_checkpoint(model, tmp_path / "bad", 2)
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
        with pytest.raises(ServerError, match="still serving policy version 1"):
            ServerClient(running.url).post("/v1/weights/checkpoint", {"path": str(path), "version": 2})
        with pytest.raises(ServerError, match="does not exist"):
            ServerClient(running.url).post("/v1/weights/checkpoint", {"path": str(tmp_path / "nope"), "version": 2})
        assert running.state.policy_version == 1 and greedy_ids(running.url) == changed
    finally:
        running.stop()


def test_ipc_handles_are_refused_unless_allowed(server):
    response = httpx.post(server.url + "/v1/weights/ipc", json={"version": 3, "handles": "gASVAAAA"})
    error = response.json()["error"]
    assert response.status_code == 403 and "--allow-ipc" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "ipc_not_allowed"
    assert server.state.policy_version == 0
