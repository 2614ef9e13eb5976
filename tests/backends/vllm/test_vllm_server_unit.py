"""Server mode's parts that need no vLLM: config, clear errors for a server that cannot serve, weight files,
request and response mapping. Not marked `vllm`: these run in the main suite (`make test`).

The fake server answers like vLLM 0.32's OpenAI server (shapes copied from a real one's responses).
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import torch
from safetensors.torch import load, load_file

from tandemrl.backends.vllm.convert import choice_to_rollout, completion_body
from tandemrl.backends.vllm.errors import VLLMBackendError, VLLMServerError
from tandemrl.backends.vllm.server import VLLMServerBackend
from tandemrl.backends.vllm.transfer import WEIGHTS_FILE, encode_weights, plain_tensors, write_weights
from tandemrl.config import ConfigError, VLLMConfig, load_config
from tandemrl.types import Request, RequestStats, SamplingParams
from tandemrl.backends.vllm.launch import free_port

URL = "http://127.0.0.1:8000"  # the fake transport answers; nothing listens here
MODELS = {"object": "list", "data": [{"id": "/models/tiny", "object": "model", "max_model_len": 512}]}


def fake_vllm(version: str = "0.32.0", dev_mode: bool = True, extension: bool = True) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/version":
            return httpx.Response(200, json={"version": version})
        if path == "/v1/models":
            return httpx.Response(200, json=MODELS)
        if not dev_mode and path in ("/weight_info", "/collective_rpc", "/pause"):
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "default"})
        if path in ("/pause", "/resume"):
            return httpx.Response(200, json={"status": "ok"})
        if path == "/collective_rpc" and not extension:
            method = json.loads(request.content)["method"]
            message = f"Call to collective_rpc method failed: Method '{method}' is not implemented."
            return httpx.Response(500, json={"error": {"message": message, "code": 500}})
        return httpx.Response(500, json={"error": {"message": f"unexpected {path}"}})

    return httpx.MockTransport(handle)


def server_settings(**overrides) -> VLLMConfig:
    return VLLMConfig(mode="server", url=URL, **overrides)


def test_config_takes_server_mode_and_names_what_is_missing():
    cfg = load_config(None, ['rollout.backend="vllm"', 'rollout.vllm.mode="server"',
                             'rollout.vllm.url="http://127.0.0.1:8000"'])
    assert cfg.rollout.vllm.mode == "server" and cfg.rollout.vllm.weight_transfer == "disk"
    assert load_config(None, ['rollout.backend="vllm"']).rollout.vllm.mode == "colocated"  # today's default
    with pytest.raises(ConfigError, match="rollout.vllm.mode = 'server' needs rollout.vllm.url"):
        load_config(None, ['rollout.backend="vllm"', 'rollout.vllm.mode="server"'])
    VLLM = 'rollout.backend="vllm"'
    with pytest.raises(ConfigError, match="is not an http\\(s\\) URL"):
        load_config(None, [VLLM, 'rollout.vllm.mode="server"', 'rollout.vllm.url="127.0.0.1:8000"'])
    with pytest.raises(ConfigError, match="is not an http\\(s\\) URL"):
        load_config(None, [VLLM, 'rollout.vllm.mode="server"', 'rollout.vllm.url="http://host:port"'])
    with pytest.raises(ConfigError, match="url is set but rollout.vllm.mode = 'colocated'"):
        load_config(None, [VLLM, 'rollout.vllm.url="http://127.0.0.1:8000"'])
    with pytest.raises(ConfigError, match="set rollout.vllm.weights_dir to a directory both hosts see"):
        load_config(None, [VLLM, 'rollout.vllm.mode="server"', 'rollout.vllm.url="http://gpu-7:8000"'])
    remote = [VLLM, 'rollout.vllm.mode="server"', 'rollout.vllm.url="http://gpu-7:8000"']
    load_config(None, [*remote, 'rollout.vllm.weight_transfer="http"'])
    load_config(None, [*remote, 'rollout.vllm.weights_dir="/shared/weights"'])
    with pytest.raises(ConfigError, match="weight_transfer"):
        load_config(None, [*remote, 'rollout.vllm.weight_transfer="nccl"'])


def test_no_server_at_the_url_says_how_to_start_one(model, tokenizer):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(VLLMBackendError, match=f"no vLLM server answers at {url} .*ConnectError.*"
                                               "VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server"):
        VLLMServerBackend(model, tokenizer, VLLMConfig(mode="server", url=url, timeout_s=5))


def test_a_server_without_dev_mode_is_named(model, tokenizer):
    with pytest.raises(VLLMBackendError, match="no /weight_info route: it was started without VLLM_SERVER_DEV_MODE=1"):
        VLLMServerBackend(model, tokenizer, server_settings(), transport=fake_vllm(dev_mode=False))


def test_an_old_vllm_server_names_the_supported_version(model, tokenizer):
    with pytest.raises(VLLMBackendError, match="vLLM 0.8.5 is installed; .* supports vLLM >= 0.32"):
        VLLMServerBackend(model, tokenizer, server_settings(), transport=fake_vllm(version="0.8.5"))


def test_a_server_without_the_worker_extension_is_named(model, tokenizer):
    backend = VLLMServerBackend(model, tokenizer, server_settings(weight_transfer="http"),
                                transport=fake_vllm(extension=False))
    with pytest.raises(VLLMBackendError,
                       match="no worker method 'tandemrl_load_encoded_weights'.*--worker-extension-cls"):
        backend.update_weights(1)
    backend.close()


def test_a_server_that_stops_answering_mid_run(model, tokenizer):
    def gone(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    backend = VLLMServerBackend(model, tokenizer, server_settings(), transport=fake_vllm(),
                                async_transport=httpx.MockTransport(gone))
    backend.synced_version = 3  # pretend the weights are in: the next call goes straight to /v1/completions
    with pytest.raises(VLLMServerError, match=f"the vLLM server at {URL} did not answer POST /v1/completions"):
        backend.generate([Request("a", [1, 2], SamplingParams(max_tokens=2))], 3)
    backend.close()


def test_tied_weights_are_written_whole(tmp_path, make_model):
    model = make_model(tie_word_embeddings=True)
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    plain = plain_tensors(state)
    assert plain["lm_head.weight"].data_ptr() != plain["model.embed_tokens.weight"].data_ptr()
    path = write_weights(state, tmp_path / "w")
    assert path.name == WEIGHTS_FILE and [p.name for p in path.parent.iterdir()] == [WEIGHTS_FILE]
    saved = load_file(path)
    assert set(saved) == set(state)  # lm_head too: vLLM 0.32's reload leaves a tied head stale without it
    assert all(torch.equal(saved[k], v) for k, v in state.items())
    decoded = load(base64.b64decode(encode_weights(state)))
    assert all(torch.equal(decoded[k], v) for k, v in state.items())


def test_completion_body_matches_the_colocated_sampling():
    req = Request("a", [3, 4], SamplingParams(max_tokens=5, temperature=0.5, top_k=7, seed=10, stop=("x",)))
    body = completion_body("m", req, eos_ids=[1], index=4, n=3)
    assert body["prompt"] == [3, 4] and body["n"] == 3 and body["seed"] == 14  # vLLM: sample j gets seed + j
    assert (body["stop"], body["stop_token_ids"], body["logprobs"], body["return_token_ids"]) == (["x"], [1], 0, True)
    free = completion_body("m", Request("b", [3], SamplingParams(ignore_eos=True)), eos_ids=[1], index=0, n=1)
    assert free["seed"] is None and free["stop_token_ids"] is None and free["stop"] is None


def test_a_choice_becomes_a_rollout():
    decode = lambda ids: "".join(chr(ord("a") + i) for i in ids)  # noqa: E731
    req = Request("r", [1, 2], SamplingParams(max_tokens=3))
    choice = {"index": 0, "text": "x", "token_ids": [0, 2, 3], "finish_reason": "length",
              "logprobs": {"token_logprobs": [-0.1, -0.2, -0.3], "tokens": ["a", "c", "d"]}}
    rollout = choice_to_rollout(req, choice, decode, 5, RequestStats())
    assert (rollout.completion_ids, rollout.logprobs) == ([0, 2, 3], [-0.1, -0.2, -0.3])
    assert rollout.finish_reason == "length"
    assert rollout.text == "acd" and rollout.policy_version == 5 and rollout.stats.generated_tokens == 3
    short = choice_to_rollout(req, {**choice, "logprobs": None}, decode, 5, RequestStats())
    assert short.finish_reason == "error" and "0 log-probs for 3 tokens" in short.error


def test_server_mode_never_imports_vllm():
    """The trainer's environment need not have vLLM (its wheel pins another torch): server mode is HTTP only."""
    import subprocess
    import sys

    code = ("import sys; import tandemrl.backends.vllm.server, tandemrl.backends.factory; "
            "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
