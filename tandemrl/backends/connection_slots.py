"""An httpx transport that keeps up to N connections open, each its own one-connection pool.

httpcore 1.0's pool, behind every ``httpx.AsyncClient``, re-scans all its connections for every queued request on
every request and every response close (O(connections x requests) a pass, and a socket poll per idle connection):
64 streams sent again over 64 kept-alive connections waited 1-2 s on the 2-core CPU machine before they were even
written, the server then answering each within 0.05 s (bench/RESULTS.md, issue 40; fixed upstream in httpx2's
pool). Here a request takes a free slot in O(1) and keeps it until its response is closed (a stream holds it while
it runs).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx


class ConnectionSlots(httpx.AsyncBaseTransport):
    """At most ``size`` requests in flight, each on a kept-alive connection of its own (made when first needed);
    ``transport_options``: httpx.AsyncHTTPTransport's (verify, retries, ...), for every slot."""

    def __init__(self, size: int, **transport_options: Any) -> None:
        if size < 1:
            raise ValueError(f"ConnectionSlots needs at least one slot, got {size}")
        self._options = {"limits": httpx.Limits(max_connections=1, max_keepalive_connections=1), **transport_options}
        if "verify" not in self._options:  # one TLS context for all: a transport builds its own in ~40 ms otherwise
            self._options["verify"] = httpx.create_ssl_context()
        self._free = asyncio.Semaphore(size)
        self._idle: list[httpx.AsyncHTTPTransport] = []  # the last one used first: its connection is the warmest
        self._all: list[httpx.AsyncHTTPTransport] = []

    @property
    def connections(self) -> int:
        """Slots made so far (each holds at most one connection)."""
        return len(self._all)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("pool")
        try:
            await asyncio.wait_for(self._free.acquire(), timeout)
        except asyncio.TimeoutError:
            raise httpx.PoolTimeout(f"no free connection within {timeout} s", request=request) from None
        slot = self._idle.pop() if self._idle else self._new_slot()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._idle.append(slot)
                self._free.release()

        try:
            response = await slot.handle_async_request(request)
        except BaseException:
            release()
            raise
        response.stream = _ReleasedOnClose(response.stream, release)
        return response

    def _new_slot(self) -> httpx.AsyncHTTPTransport:
        slot = httpx.AsyncHTTPTransport(**self._options)
        self._all.append(slot)
        return slot

    async def aclose(self) -> None:
        for slot in self._all:
            await slot.aclose()


class _ReleasedOnClose(httpx.AsyncByteStream):
    """A response body that gives its slot back when closed (read to the end, or left early)."""

    def __init__(self, stream: Any, release: Any) -> None:
        self._stream = stream
        self._release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._release()
