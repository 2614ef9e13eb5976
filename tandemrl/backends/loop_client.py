"""One ``httpx.AsyncClient`` (one connection pool) on an event loop thread of its own, for callers on any thread.

``asyncio.run`` per call would open a client, and its connections, per call; callers that send many small requests
from several threads (a server's turns, backends/server_turns.py) share this one instead.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

import httpx

T = TypeVar("T")


class LoopClient:
    def __init__(self, open_client: Callable[[], httpx.AsyncClient]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-client-loop", daemon=True)
        self._thread.start()
        self.http = open_client()
        self._lock = threading.Lock()  # a call is on the loop before close cancels it, or refused
        self._closed = False

    def run(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await call(http, *args)`` on the client's loop; blocks the calling thread until it returns."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the HTTP client was closed")
            future = asyncio.run_coroutine_threadsafe(call(self.http, *args), self._loop)
        return future.result()

    def close(self) -> None:
        """Cancel what is still in flight (nobody reads it), close the connections, stop the loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _shutdown(self) -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.http.aclose()
