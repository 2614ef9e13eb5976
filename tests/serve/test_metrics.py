"""/metrics under load: the queue depth (requests the engine thread has not taken yet) and how long requests waited
there, the staleness of running requests (weight pushes they outlived), tokens/s and the server's time to first
token, read while a stream runs and after it ends."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.serve.conftest import MODEL_NAME, serve_config, start_server  # noqa: E402


@pytest.fixture()
def running(tiny_dir):
    server = start_server(serve_config(tiny_dir))  # its own: this test pushes a version
    yield server
    server.stop()


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(f"tandemrl_{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def wait_for(url: str, name: str, value: float) -> None:
    deadline = time.monotonic() + 20
    while metric(url, name) != value:
        assert time.monotonic() < deadline, f"{name} stayed {metric(url, name)}, expected {value}"
        time.sleep(0.01)


def test_metrics_show_queue_depth_staleness_and_tokens_per_second(running):
    url, loop = running.url, running.state.loop
    before = {name: metric(url, name) for name in ("generated_tokens_total", "first_tokens_total",
                                                   "queue_wait_seconds_total", "first_token_seconds_total")}
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.completions.create(model=MODEL_NAME, prompt="1+2=", max_tokens=480, stream=True,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    chunks = [next(stream)]  # it runs
    hold = threading.Event()
    loop.between_steps(hold.wait)  # the engine thread waits here: what arrives now queues
    other = threading.Thread(target=lambda: client.completions.create(
        model=MODEL_NAME, prompt="3+4=", max_tokens=4, extra_body={"ignore_eos": True}))
    other.start()
    wait_for(url, "requests_queued", 1)
    assert metric(url, "running_version_lag") == 0
    pusher = threading.Thread(target=lambda: running.state.weights.set_version("test", 1))
    pusher.start()
    time.sleep(0.1)
    hold.set()  # the queued request is added under version 0, then the push lands before the next step
    pusher.join(20)
    wait_for(url, "running_version_lag", 1)  # the stream started under version 0 and outlived one push
    assert metric(url, "requests_queued") == 0
    chunks += list(stream)
    other.join(20)
    assert sum(len(c.choices[0].model_extra.get("token_ids", [])) for c in chunks) == 480
    assert metric(url, "generated_tokens_total") - before["generated_tokens_total"] == 480 + 4
    assert metric(url, "tokens_per_second") > 0
    assert metric(url, "first_tokens_total") - before["first_tokens_total"] == 1  # the stream's; the other did not
    assert metric(url, "first_token_seconds_total") > before["first_token_seconds_total"]
    assert metric(url, "queue_wait_seconds_total") - before["queue_wait_seconds_total"] >= 0.1  # the held one
    assert metric(url, "engine_step_seconds_total") > 0
    wait_for(url, "running_version_lag", 0)
    assert metric(url, "requests_queued") == 0 and metric(url, "requests_waiting") == 0
