"""The SSE response of the completion routes (app._EngineStream): a client's disconnect ends its stream (and with
it the request's sequences), a cancellation from outside still propagates, and the request's Arrivals count is
released either way. And `tandemrl serve` freezes its start-up heap out of the garbage collector's walks."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tandemrl.serve.app import _EngineStream
from tandemrl.serve.server import freeze_startup_heap


def run_stream(disconnect_after: float | None, cancel_after: float | None) -> tuple[list[dict], list[str], list[bool]]:
    sent: list[dict] = []
    produced: list[str] = []
    closed: list[bool] = []
    released: list[bool] = []

    async def endless():
        try:
            while True:
                produced.append("data: x\n\n")
                yield produced[-1]
                await asyncio.sleep(0.005)
        finally:
            closed.append(True)  # state.run aborts the request's sequences here

    async def receive() -> dict:
        await asyncio.sleep(disconnect_after if disconnect_after is not None else 3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    async def main() -> None:
        response = _EngineStream(endless(), lambda: released.append(True))
        task = asyncio.ensure_future(response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send))
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            task.cancel()
        await asyncio.wait_for(task, 10)  # a disconnect that went unnoticed would stream forever

    asyncio.run(main())
    return sent, closed, released


def test_a_disconnect_ends_the_stream_and_releases_the_request():
    sent, closed, released = run_stream(disconnect_after=0.05, cancel_after=None)  # returns: no CancelledError
    assert sent[0]["type"] == "http.response.start" and len(sent) > 2
    assert closed == [True] and released == [True]


def test_a_cancellation_from_outside_propagates():
    with pytest.raises(asyncio.CancelledError):
        run_stream(disconnect_after=None, cancel_after=0.05)


def test_the_start_up_heap_is_frozen():
    gc.unfreeze()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
