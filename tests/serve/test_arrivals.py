"""Requests that arrive together at an idle engine start in one step: the engine thread waits for the requests the
server is still reading (Arrivals) and for those that follow the last within GATHER_QUIET_S (new connections), never
longer than GATHER_MAX_S; a request that never reaches the engine is uncounted (else every idle start would wait the
full bound)."""

from __future__ import annotations

import threading
import time

import httpx

from tandemrl.serve.engine_loop import GATHER_MAX_S, GATHER_QUIET_S, EngineLoop
from tandemrl.serve.state import Arrivals
from tandemrl.types import Request, Rollout, SamplingParams
from tests.serve.conftest import MODEL_NAME


class StepRecorder:
    """An engine whose step finishes every request it has; it records which ones each step ran."""

    def __init__(self) -> None:
        self.waiting: list[Request] = []
        self.steps: list[list[str]] = []

    def add_request(self, request: Request, policy_version: int = 0) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting)

    def step(self) -> list[Rollout]:
        batch, self.waiting = self.waiting, []
        self.steps.append([r.request_id for r in batch])
        return [Rollout(r.request_id, r.prompt_ids, [1], [0.0], "length") for r in batch]

    def progress(self, sent):  # noqa: ANN001 - the engine's signature
        return []

    def abort(self, request_id: str) -> None:
        pass


def _request(name: str) -> Request:
    return Request(name, [1, 2], SamplingParams(max_tokens=1))


def test_requests_still_arriving_join_an_idle_engines_first_step():
    engine, arrivals = StepRecorder(), Arrivals()
    loop = EngineLoop(engine, arriving=lambda: arrivals.count)  # type: ignore[arg-type]
    done = threading.Event()
    finished: list[str] = []

    def sink(events) -> None:  # noqa: ANN001
        finished.extend(e.rollout.request_id for e in events)
        if len(finished) == 3:
            done.set()

    loop.start()
    try:
        releases = [arrivals.take() for _ in range(3)]  # three bodies read, one submitted at once
        releases[0]()
        loop.submit([_request("a")], sink, stream=False)
        time.sleep(GATHER_MAX_S / 3)  # the others are still being read
        for name, release in zip("bc", releases[1:]):
            release()
            loop.submit([_request(name)], sink, stream=False)
        assert done.wait(10)
    finally:
        loop.stop()
    assert engine.steps == [["a", "b", "c"]]


def _run_submits(engine: StepRecorder, names: str, gap_s: float) -> None:
    """Submit one request per name, ``gap_s`` apart, none announced (as on new connections: each body is read and
    submitted before the next request's bytes arrive); returns once all finished."""
    loop = EngineLoop(engine, arriving=lambda: 0)  # type: ignore[arg-type]
    done = threading.Event()
    finished: list[str] = []

    def sink(events) -> None:  # noqa: ANN001
        finished.extend(e.rollout.request_id for e in events)
        if len(finished) == len(names):
            done.set()

    loop.start()
    try:
        for name in names:
            loop.submit([_request(name)], sink, stream=False)
            time.sleep(gap_s)
        assert done.wait(10)
    finally:
        loop.stop()


def test_requests_that_follow_each_other_closely_join_an_idle_engines_first_step():
    engine = StepRecorder()
    _run_submits(engine, "abcd", GATHER_QUIET_S / 10)
    assert engine.steps == [["a", "b", "c", "d"]]


def test_requests_further_apart_than_the_quiet_window_start_without_waiting_for_each_other():
    engine = StepRecorder()
    _run_submits(engine, "ab", GATHER_QUIET_S * 20)
    assert engine.steps == [["a"], ["b"]]


def run_one_request(loop: EngineLoop) -> None:
    """Start ``loop``, submit request "a", return once it finished (the loop stopped)."""
    done = threading.Event()
    loop.start()
    try:
        loop.submit([_request("a")], lambda events: done.set(), stream=False)
        assert done.wait(10)
    finally:
        loop.stop()


def test_an_idle_engine_waits_for_arrivals_no_longer_than_the_bound():
    engine, arrivals = StepRecorder(), Arrivals()
    arrivals.take()  # never submitted
    run_one_request(EngineLoop(engine, arriving=lambda: arrivals.count))  # type: ignore[arg-type]
    assert engine.steps == [["a"]]


def test_every_request_is_uncounted_however_it_ends(server):
    body = {"model": MODEL_NAME, "prompt": [5, 6], "max_tokens": 2}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.post("/v1/completions", json=body).status_code == 200
        assert http.post("/v1/completions", json={**body, "stream": True}).status_code == 200
        assert http.post("/v1/completions", json={**body, "max_tokens": 10**6}).status_code == 400  # refused
        assert http.post("/v1/completions", json={**body, "model": "other"}).status_code == 404
        with http.stream("POST", "/v1/completions", json={**body, "max_tokens": 50, "stream": True}):
            pass  # left before reading anything
    deadline = time.monotonic() + 10
    while server.state.arrivals.count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.state.arrivals.count == 0
