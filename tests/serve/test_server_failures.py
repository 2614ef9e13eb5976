"""A rollout server that fails: the batch is retried whole with backoff, or the call fails with a message naming
the server; the trainer never updates on part of a batch. The server killed mid-rollout (a real process)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

pytest.importorskip("openai")

from tandemrl.backends.server_backend import RolloutServerError, ServerBackend  # noqa: E402
from tandemrl.types import Request, SamplingParams  # noqa: E402
from tests.serve.conftest import REPO, child_env  # noqa: E402



def requests(groups: int = 3, n: int = 2, max_tokens: int = 2) -> list[Request]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [Request(f"g{g}-{j}", [3 + g, 4], params) for g in range(groups) for j in range(n)]


def fake_server(fail: callable):
    """An httpx transport answering like the server; ``fail(call_number, body)`` -> a status to fail with, or None."""
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        body = json.loads(request.content)
        calls.append(body)
        status = fail(len(calls), body)
        if status == "drop":
            raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)
        if status is not None:
            return httpx.Response(status, json={"error": {"message": "overloaded"}})
        choices = [{"index": i, "text": "x", "token_ids": [7] * body["max_tokens"], "finish_reason": "length",
                    "logprobs": {"token_logprobs": [-0.5] * body["max_tokens"]}, "policy_version": 0}
                   for i in range(body["n"])]
        return httpx.Response(200, json={"choices": choices})

    return httpx.MockTransport(handle), calls


def test_a_group_that_fails_makes_the_whole_batch_retry(tmp_path):
    transport, calls = fake_server(lambda k, body: 503 if k == 2 else None)  # the 2nd group's first answer fails
    waits = []
    backend = ServerBackend("http://rollouts", retries=2, backoff_s=0.5, transport=transport, sleep=waits.append)
    out = backend.generate(requests())
    assert [r.request_id for r in out] == [r.request_id for r in requests()]
    assert all(r.completion_ids == [7, 7] and r.logprobs == [-0.5, -0.5] for r in out)
    assert len(calls) == 3 + 3 and all(c["n"] == 2 for c in calls)  # 3 groups of n=2, all sent again
    assert waits == [0.5]


def test_a_server_that_never_answers_fails_with_a_clear_message():
    transport, calls = fake_server(lambda k, body: "drop" if k % 3 == 0 else None)  # one group always cut off
    waits = []
    backend = ServerBackend("http://rollouts", retries=3, backoff_s=1.0, transport=transport, sleep=waits.append)
    with pytest.raises(RolloutServerError, match=r"rollouts did not answer after 4 attempts .*server_retries = 3"
                                                 r".*batch was not used.*disconnected"):
        backend.generate(requests())
    assert waits == [1.0, 2.0, 4.0]  # exponential backoff


def test_nothing_listening():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and nothing listens once closed
    backend = ServerBackend(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01)
    with pytest.raises(RolloutServerError, match=f"127.0.0.1:{port} did not answer after 2 attempts"):
        backend.generate(requests())


def start_server_process(model_dir: Path) -> tuple[subprocess.Popen, str]:
    env = child_env()
    proc = subprocess.Popen([sys.executable, "-m", "tandemrl.cli", "serve", str(model_dir), "--port", "0",
                             "--set", "model.device=\"cpu\"", "--set", "engine.num_blocks=128",
                             "--set", "engine.decode_steps=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()
    if not line.startswith("serving"):
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, line.split(" on ")[1].split()[0]


def test_server_killed_mid_rollout(tiny_dir):
    proc, url = start_server_process(tiny_dir)
    try:
        assert httpx.get(url + "/health").json()["status"] == "ok"
        backend = ServerBackend(url, retries=1, backoff_s=0.2, timeout_s=60)
        errors = []

        def rollout() -> None:
            try:
                backend.generate(requests(groups=4, n=4, max_tokens=480))
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        thread = threading.Thread(target=rollout)
        thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the server is decoding the batch
            metrics = httpx.get(url + "/metrics").text
            if "tandemrl_requests_running 0" not in metrics:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        thread.join(60)
        assert len(errors) == 1 and isinstance(errors[0], RolloutServerError), errors
        assert "did not answer after 2 attempts" in str(errors[0]) and url in str(errors[0])
    finally:
        proc.kill()
        proc.wait()


def test_the_trainer_does_not_step_without_a_whole_batch(tiny_dir, tmp_path):
    from rich.console import Console

    from tandemrl.config import validate_config
    from tandemrl.telemetry.progress import TrainDisplay
    from tandemrl.train.loop import train_step
    from tandemrl.train.setup import TrainerState, build_run
    from tests.serve.conftest import serve_config, start_server

    running = start_server(serve_config(tiny_dir))
    cfg = validate_config({
        "model": {"name_or_path": str(tiny_dir), "device": "cpu"},
        "rollout": {"backend": "server", "server_url": running.url, "prompts_per_step": 2, "group_size": 2,
                    "server_retries": 1, "server_backoff_s": 0.01},
        "sync": {"kind": "checkpoint"}, "log": {"tensorboard": False}})
    run = build_run(cfg, tmp_path / "run")
    state = TrainerState()
    run.sync.push(run.model, 0)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    running.stop()  # the server goes away before the step's rollouts
    with pytest.raises(RolloutServerError, match="did not answer"):
        train_step(run, state, TrainDisplay(1, 0, Console(file=io.StringIO())))
    assert state.step == 0 and state.policy_version == 0
    assert all(torch.equal(p, before[n]) for n, p in run.model.named_parameters())
    assert not run.optimizer.state  # no optimizer step was taken
