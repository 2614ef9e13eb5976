"""Bad requests get a 4xx with a message and the server keeps serving; a client that goes away mid-stream frees
its sequence; concurrent requests share engine steps (continuous batching)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.serve.conftest import MODEL_NAME  # noqa: E402


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kwargs)


def error_message(response: httpx.Response) -> str:
    """The message of OpenAI's error body, after checking its shape: a string code or null, not the status."""
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == ("server_error" if response.status_code >= 500 else "invalid_request_error"), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error["message"]


@pytest.mark.parametrize("body, status, words", [
    ({"model": "gpt-4", "prompt": "1+1=", "max_tokens": 2}, 404, ["'gpt-4'", "does not exist", MODEL_NAME]),
    ({"model": MODEL_NAME, "prompt": "1+1=", "max_tokens": 100000}, 400, ["max_tokens", "context"]),
    ({"model": MODEL_NAME, "prompt": "1+1=", "max_tokens": "ten"}, 400, ["max_tokens", "integer"]),
    ({"model": MODEL_NAME, "prompt": "1+1=", "temperature": -1}, 400, ["temperature"]),
    ({"model": MODEL_NAME, "prompt": 42}, 400, ["prompt"]),
    ({"model": MODEL_NAME, "prompt": [5, 99999]}, 400, ["out of range"]),
    ({"model": MODEL_NAME, "prompt": "1+1=", "n": 0}, 400, ["n"]),
    ({"model": MODEL_NAME, "prompt": "1+1=", "logprobs": 5}, 400, ["logprobs"]),
    ({"prompt": "1+1="}, 400, ["model", "Field required"]),
])
def test_bad_completion_requests_get_a_4xx_and_a_message(server, body, status, words):
    response = post(server, "/v1/completions", json=body)
    assert response.status_code == status, response.text
    message = error_message(response)
    for word in words:
        assert word in message, message


def test_bad_json_and_bad_chat_bodies(server):
    response = post(server, "/v1/completions", content=b'{"model": "x", "prompt": ', 
                    headers={"content-type": "application/json"})
    assert response.status_code == 400 and "JSON" in error_message(response)
    response = post(server, "/v1/chat/completions", json={"model": MODEL_NAME, "messages": []})
    assert response.status_code == 400 and "messages" in error_message(response)
    response = post(server, "/v1/chat/completions",
                    json={"model": MODEL_NAME, "messages": [{"role": "wizard", "content": "hi"}]})
    assert response.status_code == 400 and "role" in error_message(response)


def test_the_server_keeps_serving_after_bad_requests(server):
    for _ in range(3):
        post(server, "/v1/completions", json={"model": MODEL_NAME, "prompt": "1", "max_tokens": -3})
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL_NAME, prompt="1+1=", max_tokens=10**6)
    out = client.completions.create(model=MODEL_NAME, prompt="1+1=", max_tokens=3, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3


def metric(server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(f"tandemrl_{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def test_a_client_that_disconnects_mid_stream_frees_its_sequence(server):
    aborted, finished = metric(server, "requests_aborted_total"), metric(server, "requests_finished_total")
    body = {"model": MODEL_NAME, "prompt": "1+2=", "max_tokens": 480, "ignore_eos": True, "stream": True}
    received = 0
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            received += line.startswith("data: ")
            if received == 2:
                break  # leaves the with-block: the connection closes mid-stream
    deadline = time.monotonic() + 20
    while metric(server, "requests_aborted_total") < aborted + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "requests_aborted_total") == aborted + 1
    assert metric(server, "requests_finished_total") == finished  # it never ran to its 480 tokens
    assert metric(server, "requests_running") == 0 and metric(server, "requests_waiting") == 0
    assert metric(server, "kv_blocks_used") == 0  # its KV blocks went back to the pool


def test_a_request_joins_the_running_batch(server):
    """A long request is streaming; a short one sent meanwhile finishes first (it did not wait its turn), and the
    decode steps carried both sequences at once."""
    steps0, tokens0 = metric(server, "decode_steps_total"), metric(server, "decode_tokens_total")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    done: dict[str, float] = {}
    started = threading.Event()

    def long_request() -> None:
        stream = client.completions.create(model=MODEL_NAME, prompt="4+4=", max_tokens=400, stream=True,
                                           extra_body={"ignore_eos": True})
        for _ in stream:
            started.set()
        done["long"] = time.monotonic()

    thread = threading.Thread(target=long_request)
    thread.start()
    assert started.wait(30)
    client.completions.create(model=MODEL_NAME, prompt="1+1=", max_tokens=20, extra_body={"ignore_eos": True})
    done["short"] = time.monotonic()
    thread.join(60)
    assert done["short"] < done["long"]
    steps = metric(server, "decode_steps_total") - steps0
    tokens = metric(server, "decode_tokens_total") - tokens0
    assert tokens > steps  # some decode steps computed more than one sequence


def test_concurrent_requests_are_batched(server):
    steps0, tokens0 = metric(server, "decode_steps_total"), metric(server, "decode_tokens_total")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    results = []

    def one(i: int) -> None:
        results.append(client.completions.create(model=MODEL_NAME, prompt=f"{i}+1=", max_tokens=64,
                                                 extra_body={"ignore_eos": True}).usage.completion_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [64] * 8
    steps = metric(server, "decode_steps_total") - steps0
    tokens = metric(server, "decode_tokens_total") - tokens0
    assert tokens / steps > 2.0, (tokens, steps)  # one-at-a-time serving would give 1.0


def test_a_non_streaming_client_that_goes_away_frees_its_sequence(server):
    aborted, finished = metric(server, "requests_aborted_total"), metric(server, "requests_finished_total")
    hold = threading.Event()
    server.state.loop.between_steps(hold.wait)  # the engine waits: the request cannot finish meanwhile
    body = {"model": MODEL_NAME, "prompt": "1+2=", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    deadline = time.monotonic() + 10
    while server.state.loop._commands.qsize() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the request, then its abort, queue up behind the hold
    hold.set()
    while metric(server, "requests_aborted_total") < aborted + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "requests_aborted_total") == aborted + 1
    assert metric(server, "requests_finished_total") == finished


def test_an_engine_failure_fails_its_requests_and_the_server_recovers(server, monkeypatch):
    engine = server.state.loop.engine
    real_step = engine.step
    calls = {"n": 0}

    def failing_step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device lost")
        return real_step()

    hold = threading.Event()
    server.state.loop.between_steps(hold.wait)
    monkeypatch.setattr(engine, "step", failing_step)
    results = {}

    def call() -> None:
        results["r"] = httpx.post(server.url + "/v1/completions", timeout=30,
                                  json={"model": MODEL_NAME, "prompt": "1+1=", "max_tokens": 4})

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 10
    while server.state.loop._commands.qsize() < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    hold.set()
    thread.join(30)
    assert results["r"].status_code == 500 and "device lost" in error_message(results["r"])
    assert httpx.get(server.url + "/health").status_code == 503
    ok = httpx.post(server.url + "/v1/completions", timeout=30,
                    json={"model": MODEL_NAME, "prompt": "1+1=", "max_tokens": 4, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(server.url + "/health").status_code == 200
