"""A server's turns (the agent loop against `tandemrl serve`): one HTTP client for all of them, closed when done."""

from __future__ import annotations

import asyncio
import time

import httpx

from tandemrl.backends.server_backend import ServerBackend
from tandemrl.backends.server_turns import ServerTurns
from tests.serve.test_server_failures import fake_server, requests


def counting_clients(backend: ServerBackend) -> list[httpx.AsyncClient]:
    """Every client the backend opens, in order."""
    opened: list[httpx.AsyncClient] = []
    open_client = backend.open_client

    def counted() -> httpx.AsyncClient:
        opened.append(open_client())
        return opened[-1]

    backend.open_client = counted  # type: ignore[method-assign]
    return opened


def finish(turns: ServerTurns) -> list[str]:
    done = []
    while turns.has_unfinished():
        done += [r.request_id for r in turns.step()]
    return sorted(done)


def test_the_turns_share_one_client_and_close_it():
    transport, calls = fake_server(lambda k, body: 503 if k == 3 else None)  # one turn is sent again, same client
    backend = ServerBackend("http://rollouts", retries=1, backoff_s=0.0, transport=transport, sleep=lambda s: None)
    opened = counting_clients(backend)
    turns = ServerTurns(backend, eos_ids=[0])
    batch = requests(groups=6, n=1)
    for request in batch:
        turns.add_request(request)
    assert finish(turns) == sorted(r.request_id for r in batch) and len(calls) == 7
    assert [r.request_id for r in turns.generate(requests(groups=2, n=1))] == ["g0-0", "g1-0"]
    assert len(opened) == 1 and not opened[0].is_closed
    turns.close()
    assert opened[0].is_closed
    turns.add_request(batch[0])  # a turn after close opens a client again
    assert finish(turns) == ["g0-0"] and len(opened) == 2
    turns.close()
    assert opened[1].is_closed


def test_close_cancels_the_turns_in_flight():
    never = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        await never.wait()  # the server never answers
        raise AssertionError("unreachable")

    backend = ServerBackend("http://rollouts", transport=httpx.MockTransport(hang))
    opened = counting_clients(backend)
    turns = ServerTurns(backend, eos_ids=[0])
    for request in requests(groups=3, n=1):
        turns.add_request(request)
    time.sleep(0.2)
    assert turns.step() == [] and turns.has_unfinished()
    started = time.perf_counter()
    turns.close()
    assert time.perf_counter() - started < 5 and not turns.has_unfinished() and opened[0].is_closed
