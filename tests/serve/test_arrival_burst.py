"""A burst of requests on open connections starts in an idle engine's first step also when the event loop is busy
while their bytes arrive (it parses a burst of 64 for ~11 ms before any route runs and counts it in Arrivals: longer
than GATHER_QUIET_S): the engine ends its wait only once the loop has caught up (Arrivals.settle). And the count of
requests being read is released however a request ends, else every idle start would wait GATHER_MAX_S for nothing.

The server here is the real app and uvicorn on an event loop of the test's own (so that it can be held busy), in
front of an engine that records which requests each step ran."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from typing import Iterator

import uvicorn

from tandemrl.serve import engine_loop
from tandemrl.serve.engine_loop import EngineLoop
from tandemrl.serve.app import build_app
from tandemrl.serve.server import bind_socket, fastest_io, serving_loop, uvicorn_config
from tandemrl.serve.state import Arrivals, ServerState
from tests.serve.test_arrivals import StepRecorder, run_one_request

BURST = 48
HOLD_S = 1.0  # at most this long the event loop stays busy while the burst arrives (the engine on main steps first)


class Letters:
    chat_template = None

    def decode(self, ids, skip_special_tokens=True) -> str:  # noqa: ANN001 - the tokenizer's signature
        return "x" * len(ids)


class HoldingEngine(StepRecorder):
    """Once armed, its first request makes the event loop busy (as parsing a burst would) until the test has
    written the rest of the burst and then until this engine steps, HOLD_S at most."""

    def __init__(self) -> None:
        super().__init__()
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.holding, self.written, self.stepped = threading.Event(), threading.Event(), threading.Event()

    def arm(self, event_loop: asyncio.AbstractEventLoop) -> None:
        self.steps.clear()
        self.stepped.clear()
        self.event_loop = event_loop

    def add_request(self, request, policy_version: int = 0) -> None:  # noqa: ANN001
        if self.event_loop is not None:
            self.event_loop.call_soon_threadsafe(self._hold)
            self.event_loop = None
        super().add_request(request, policy_version)

    def _hold(self) -> None:
        self.holding.set()
        self.written.wait(30)
        self.stepped.wait(HOLD_S)

    def step(self):  # noqa: ANN201
        self.stepped.set()
        return super().step()


@contextlib.contextmanager
def serving(engine: StepRecorder) -> Iterator[tuple[int, ServerState, asyncio.AbstractEventLoop]]:
    arrivals = Arrivals()
    loop = serving_loop(engine, arrivals)  # type: ignore[arg-type]
    state = ServerState(loop=loop, tokenizer=Letters(), model_name="m", max_model_len=4096, vocab_size=1000,
                        arrivals=arrivals)
    state.loop.start()
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(build_app(state), fastest_io()))
    event_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=event_loop.run_until_complete, args=(server.serve(sockets=[sock]),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the test server did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1], state, event_loop
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        state.loop.stop()


def _post(body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


def _completion(i: int) -> bytes:
    return _post(json.dumps({"model": "m", "prompt": [5 + i] * 64, "max_tokens": 1, "stream": True}).encode())


def _read_stream(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):  # the chunked stream's end
        more = conn.recv(65536)
        assert more, f"the server closed the connection: {data!r}"
        data += more
    assert b"200 OK" in data and b"[DONE]" in data, data
    return data


def test_a_burst_that_arrives_while_the_event_loop_is_busy_starts_in_one_step(monkeypatch):
    monkeypatch.setattr(engine_loop, "GATHER_MAX_S", 30.0)  # no cap on a loaded machine: the hold ends the wait
    engine = HoldingEngine()
    with serving(engine) as (port, _, event_loop):
        conns = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(BURST)]
        try:
            for i, conn in enumerate(conns):  # one request on each connection first: all of them accepted
                conn.sendall(_completion(i))
                _read_stream(conn)
            engine.arm(event_loop)
            conns[0].sendall(_completion(0))
            assert engine.holding.wait(30)
            for i, conn in enumerate(conns[1:], 1):
                conn.sendall(_completion(i))  # on loopback: in the server's socket when sendall returns
            engine.written.set()
            for conn in conns:
                _read_stream(conn)
        finally:
            for conn in conns:
                conn.close()
    assert [len(step) for step in engine.steps] == [BURST]


def test_an_idle_engine_waits_for_no_request_that_ended_before_its_submit():
    engine = StepRecorder()
    with serving(engine) as (port, state, _):
        ended = [_post(b'{"model": "m", "prompt": [5, 6'),  # bad JSON
                 _post(b'{"model": "m", "prompt": [5, 6], "max_tokens": "ten"}'),  # not valid
                 _post(b'{"model": "m", "prompt": [5, 6], "max_tokens": 100000}'),  # refused: longer than the context
                 _post(b'{"model": "other", "prompt": [5, 6]}')]  # no such model
        for request in ended:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
                conn.sendall(request)
                head = conn.recv(65536)
                assert head.startswith((b"HTTP/1.1 400", b"HTTP/1.1 404")), head
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # leaves while sending its body
            conn.sendall(_post(b'{"model": "m", "prompt": [5, 6], "max_tokens": 1}')[:-10])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # leaves before its answer
            conn.sendall(_completion(0))
        deadline = time.monotonic() + 10
        while (state.arrivals.count or state.loop.queued or engine.waiting) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state.arrivals.count == 0


def test_an_idle_engine_waits_for_the_server_to_catch_up_no_longer_than_the_bound():
    engine, waits = StepRecorder(), []

    def stuck(timeout: float) -> None:  # an event loop that never gets round to it
        waits.append(timeout)
        time.sleep(timeout)
    run_one_request(EngineLoop(engine, arriving=lambda: 0, settle=stuck))  # type: ignore[arg-type]
    assert engine.steps == [["a"]]
    assert waits and sum(waits) <= engine_loop.GATHER_MAX_S
