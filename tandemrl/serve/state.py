"""What the server's routes share: the engine loop, the tokenizer, the served model's name and limits, the weights."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from tandemrl.serve.engine_loop import EngineLoop, Event, Failed, Finished
from tandemrl.types import Request

DISCONNECT_CHECK_S = 0.25  # how often a non-streaming request asks whether its client is still there


class BadRequest(ValueError):
    """The client's request cannot be served; ``status`` is the HTTP status (4xx) it gets, ``param`` the field at
    fault and ``code`` a machine-readable reason, as in OpenAI's error body (either may be None)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


class AsyncSink:
    """A request's events on the asyncio loop that waits for them: the engine thread batches every such sink of one
    loop into one ``call_soon_threadsafe`` per step (engine_loop.Sink), and ``take`` hands over every event that
    arrived since the last call at once (several steps' worth when the reader fell behind)."""

    def __init__(self, event_loop: asyncio.AbstractEventLoop) -> None:
        self.event_loop = event_loop
        self._events: list[Event] = []
        self._waiter: asyncio.Future[None] | None = None

    def __call__(self, events: list[Event]) -> None:  # from any thread
        try:
            self.event_loop.call_soon_threadsafe(self.deliver, events)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def deliver(self, events: list[Event]) -> None:  # on the event loop
        self._events += events
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self, timeout: float | None = None) -> list[Event]:
        """The events delivered since the last call; waits for one, at most ``timeout`` seconds (then [])."""
        if not self._events:
            self._waiter = self.event_loop.create_future()
            timer = self.event_loop.call_later(timeout, _wake, self._waiter) if timeout is not None else None
            try:
                await self._waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        events, self._events = self._events, []
        return events


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


SETTLE_HOPS = 3  # see Arrivals.settle


@dataclasses.dataclass
class Arrivals:
    """Completion requests whose bodies the server has read and that it has not submitted to the engine yet: an idle
    engine waits for them before its first step (EngineLoop's ``arriving``). Changed on the event loop only, the one
    that ``event_loop`` names once a request was counted."""

    count: int = 0
    event_loop: asyncio.AbstractEventLoop | None = None

    def take(self) -> Callable[[], None]:
        """Count one more; the function returned uncounts it (once, however often called): call it at submit, and
        when the request ends without reaching the engine."""
        self.count += 1
        if self.event_loop is None:
            try:
                self.event_loop = asyncio.get_running_loop()
            except RuntimeError:  # counted outside an event loop (tests): settle has none to wait for
                pass
        counted = True

        def release() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.count -= 1
        return release

    def settle(self, timeout: float) -> None:
        """From another thread: return once the event loop has gone through what it had to do when called, so that
        each request whose bytes had reached it is counted or submitted; or after ``timeout`` seconds. A socket's
        bytes are read and parsed in one pass over the loop's ready callbacks (uvicorn's data_received: ~11 ms for a
        burst of 64, before any route runs), and each request's route runs to its submit without suspending in the
        next pass: a callback that queues itself behind the rest SETTLE_HOPS times is past both, also for bytes that
        were not read yet when called."""
        event_loop = self.event_loop
        if event_loop is None:
            return
        done = threading.Event()

        def hop(left: int) -> None:
            if left:
                event_loop.call_soon(hop, left - 1)
            else:
                done.set()
        try:
            event_loop.call_soon_threadsafe(hop, SETTLE_HOPS - 1)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            return
        done.wait(timeout)


@dataclasses.dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    weights: Any = None  # tandemrl.sync.receiver.WeightReceiver
    arrivals: Arrivals = dataclasses.field(default_factory=Arrivals)
    started: float = dataclasses.field(default_factory=time.time)
    # response ids: a random stem per server and a counter (a uuid4 per request reads os.urandom, a system call,
    # which hands the GIL to the engine thread and waits to get it back)
    _id_stem: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:16], repr=False)
    _ids: Iterator[int] = dataclasses.field(default_factory=itertools.count, repr=False)

    def response_id(self, prefix: str) -> str:
        return f"{prefix}-{self._id_stem}{next(self._ids):08x}"

    @property
    def policy_version(self) -> int:
        return self.loop.policy_version

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise BadRequest(f"model {name!r} does not exist; this server serves {self.model_name!r}", 404,
                             param="model", code="model_not_found")

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def check_prompt(self, ids: list[int], max_tokens: int | None, prompt_param: str = "prompt") -> int:
        """The max_tokens to use (the rest of the context if None); BadRequest for what cannot run. ``prompt_param``:
        the field the prompt came from (``messages`` for a chat)."""
        if not ids:
            raise BadRequest("the prompt is empty", param=prompt_param)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:5]}", param=prompt_param)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise BadRequest(f"the prompt has {len(ids)} tokens; this model's context is {self.max_model_len}",
                             param=prompt_param, code="context_length_exceeded")
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise BadRequest(f"max_tokens ({max_tokens}) + the prompt ({len(ids)} tokens) exceed this model's context "
                             f"length ({self.max_model_len}); ask for at most {room}", param="max_tokens",
                             code="context_length_exceeded")
        return max_tokens

    async def run(self, requests: list[Request], is_disconnected: Callable[[], Awaitable[bool]] | None = None,
                  stream: bool = True, arrived: Callable[[], None] | None = None) -> AsyncIterator[list[Event]]:
        """Submit ``requests`` to the engine and yield their events, a batch at a time (every event that arrived
        since the last batch), until each has finished or failed; ``stream=False``: no TokenDelta events. Leaving
        early (the client went away, the task was cancelled) aborts the rest, which frees their KV blocks.
        ``arrived``: the release of their Arrivals count, called just before the submit wakes the engine thread."""
        sink = AsyncSink(asyncio.get_running_loop())
        open_ids = {r.request_id for r in requests}
        if arrived is not None:
            arrived()
        self.loop.submit(requests, sink, stream)
        timeout = DISCONNECT_CHECK_S if is_disconnected is not None else None
        checked = time.monotonic()
        try:
            while open_ids:
                events = await sink.take(timeout)
                if is_disconnected is not None and time.monotonic() - checked >= DISCONNECT_CHECK_S:
                    checked = time.monotonic()
                    if await is_disconnected():
                        return
                for event in events:
                    if isinstance(event, (Finished, Failed)):
                        open_ids.discard(event.rollout.request_id if isinstance(event, Finished) else event.request_id)
                if events:
                    yield events
        finally:
            if open_ids:
                self.loop.abort(sorted(open_ids))
