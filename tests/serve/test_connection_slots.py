"""ConnectionSlots: concurrent streams sent again reuse their connections, and picking one costs the same however
many are open (httpcore 1.0's pool probed every idle connection for every request: quadratic, 1-2 s of a 64-stream
round's response headers on the CPU machine)."""

from __future__ import annotations

import asyncio

import httpcore
import httpx
import pytest

from tandemrl.backends.connection_slots import ConnectionSlots
from tandemrl.backends.server_backend import ServerBackend
from tests.serve.conftest import MODEL_NAME

STREAMS = 24


async def _stream(http: httpx.AsyncClient, prompt: list[int]) -> int:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 3, "stream": True, "ignore_eos": True}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        return len([line async for line in response.aiter_lines() if line.startswith("data: {")])


def test_reused_connections_cost_the_same_per_request_however_many_are_open(server, monkeypatch):
    probes = 0
    has_expired = httpcore.AsyncHTTP11Connection.has_expired

    def counted(self) -> bool:  # a socket poll on an idle connection, each time the pool looks at it
        nonlocal probes
        probes += 1
        return has_expired(self)

    monkeypatch.setattr(httpcore.AsyncHTTP11Connection, "has_expired", counted)
    http = ServerBackend(server.url, max_concurrency=STREAMS).open_client()

    async def rounds() -> list[int]:
        nonlocal probes
        async with http:
            await asyncio.gather(*(_stream(http, [5, 6, i + 7]) for i in range(STREAMS)))
            probes = 0
            return await asyncio.gather(*(_stream(http, [5, 6, i + 9]) for i in range(STREAMS)))

    assert min(asyncio.run(rounds())) >= 1
    assert probes <= 2 * STREAMS, probes  # httpx's own pool: 3,360 at 24 streams (their square)
    assert http._transport.connections == STREAMS  # the second round made no new connection


def test_a_stream_left_early_gives_its_connection_back(server):
    async def run() -> int:
        async with httpx.AsyncClient(base_url=server.url, transport=ConnectionSlots(1), timeout=30) as http:
            body = {"model": MODEL_NAME, "prompt": [5, 6], "max_tokens": 8, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as response:
                await response.aiter_lines().__anext__()  # read one line, then leave
            return await asyncio.wait_for(_stream(http, [5, 7]), 30)

    assert asyncio.run(run()) >= 1


def test_no_free_connection_within_the_pool_timeout_is_an_error(server):
    async def run() -> None:
        timeout = httpx.Timeout(30, pool=0.05)
        async with httpx.AsyncClient(base_url=server.url, transport=ConnectionSlots(1), timeout=timeout) as http:
            body = {"model": MODEL_NAME, "prompt": [5, 6], "max_tokens": 8, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body):
                await http.get("/health")

    with pytest.raises(httpx.PoolTimeout):
        asyncio.run(run())
