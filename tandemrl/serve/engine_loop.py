"""The thread that owns the engine: it takes requests, aborts and weight swaps from a queue, steps the engine and
hands every request's new tokens and its finished rollout to that request's sink.

Everything that touches the engine runs on this one thread (the engine is not thread-safe), so a weight swap
always lands between two steps: requests in flight keep going, the next step computes with the new weights.
Requests that arrive while others run join the next step (continuous batching). Requests that arrive together at
an idle engine start together: its first step waits while the server is still reading requests (``arriving``) and
while more keep coming (one within GATHER_QUIET_S of the last: clients on new connections send theirs as each
connect completes, ~1 ms apart), so they are prefilled in one step instead of the first ones running a decode burst
that the rest wait behind, while the engine thread's Python competes for the GIL with the event loop reading them.
Before it ends that wait it lets the server catch up (``settle``): an event loop parsing a burst of requests that
came at once (~11 ms for 64 in uvicorn, before any of them is counted) submits none meanwhile, which the quiet
window alone took for the end of the burst.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any, Callable

from tandemrl.engine.engine import LLMEngine
from tandemrl.types import Request, Rollout


@dataclasses.dataclass
class TokenDelta:
    """New tokens of one running request (streaming)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    policy_version: int


@dataclasses.dataclass
class Finished:
    """A request's final rollout; ``policy_version_last``: the server's version when it finished."""

    rollout: Rollout
    policy_version_last: int


@dataclasses.dataclass
class Failed:
    """The engine raised while this request ran; it was dropped."""

    request_id: str
    message: str


Event = TokenDelta | Finished | Failed
# Gets each engine step's events of its requests at once; must be thread-safe. A sink with an ``event_loop``
# attribute (an asyncio loop) and a ``deliver(events)`` method gets them on that loop instead, every such sink of one
# loop in one thread hop per step (state.AsyncSink): not one hop per request per token.
Sink = Callable[[list[Event]], None]
GATHER_MAX_S = 0.1  # how long an idle engine's first step waits at most for requests still arriving
GATHER_QUIET_S = 0.005  # ... and for the next request after the last one, when the server is reading none


@dataclasses.dataclass
class _Tracked:
    sink: Sink
    policy_version: int  # the server's version when the request entered the engine
    stream: bool  # whether its sink wants TokenDelta events (else only how it ended)
    submitted: float  # perf_counter() when submit() was called
    sent: int = 0  # tokens already handed to the sink


class EngineLoop:
    """Steps ``engine`` on its own thread; see the module doc. ``prepare`` runs before a request is added (e.g.
    to reset seeded generators when the engine is idle); ``arriving``: how many requests the caller has taken in
    and will submit soon (an idle engine's first step waits for them, GATHER_MAX_S at most); ``settle(timeout)``:
    returns once the caller has taken in (counted in ``arriving`` or submitted) every request it had received when
    called, or after ``timeout`` seconds (state.Arrivals.settle)."""

    def __init__(self, engine: LLMEngine, policy_version: int = 0,
                 prepare: Callable[[Request, bool], None] | None = None, rate_window_s: float = 10.0,
                 arriving: Callable[[], int] | None = None, settle: Callable[[float], None] | None = None) -> None:
        self.engine = engine
        self._arriving = arriving
        self._settle = settle
        self.policy_version = policy_version
        self._prepare = prepare
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._tracked: dict[str, _Tracked] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandemrl-engine", daemon=True)
        self._emitted: collections.deque[tuple[float, int]] = collections.deque()
        self._rate_window_s = rate_window_s
        self._rate_lock = threading.Lock()  # the engine thread appends, /metrics reads; submit counts under it too
        self.counters = {"requests": 0, "finished": 0, "aborted": 0, "failed": 0, "generated_tokens": 0,
                         "first_tokens": 0}
        # seconds: requests' waits from submit() until the engine thread took them, streamed requests' waits from
        # submit() until their first token went to their sink, and the engine thread's time inside steps
        self.seconds = {"queue_wait": 0.0, "first_token": 0.0, "steps": 0.0}
        self._submitted = 0  # requests handed to submit (callers' thread); counters["requests"]: those added
        self._outbox: dict[int, tuple[Sink, list[Event]]] = {}  # this step's events, by sink
        self.version_lag = 0  # served version minus the oldest running request's entry version (pushes it outlived)
        self.last_error: str | None = None  # the traceback of the last step, if it failed

    # ------------------------------------------------------------------ called from any thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(lambda: None)  # wake the thread
        self._thread.join(timeout=30)

    def submit(self, requests: list[Request], sink: Sink, stream: bool = True) -> None:
        """``stream``: hand the sink each step's new tokens (TokenDelta); else only Finished / Failed."""
        with self._rate_lock:  # callers may be several threads
            self._submitted += len(requests)
        submitted = time.perf_counter()
        self._commands.put(lambda: self._add(requests, sink, stream, submitted))

    def abort(self, request_ids: list[str]) -> None:
        self._commands.put(lambda: self._abort(request_ids))

    def between_steps(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the engine thread between two steps; the future holds its result or its error."""
        future: Future = Future()

        def call() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)

        self._commands.put(call)
        return future

    @property
    def queued(self) -> int:
        """Requests submitted that the engine thread has not added yet (it is inside a step, or a weight push)."""
        return self._submitted - self.counters["requests"]

    def tokens_per_second(self) -> float:
        now = time.perf_counter()
        with self._rate_lock:
            recent = sum(n for t, n in self._emitted if now - t <= self._rate_window_s)
        return recent / self._rate_window_s

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        while not self._stop.is_set():
            idle = not self.engine.has_unfinished()
            self._take_commands(block=idle)
            if self._stop.is_set():
                break
            if self.engine.has_unfinished():
                if idle:
                    self._gather()
                self._step()

    def _gather(self) -> None:
        """Take the requests still arriving before an idle engine's first step (each submit wakes this thread): those
        the server is reading, each that comes within GATHER_QUIET_S of the last, and those the server had received
        when that window ran out (``settle``); GATHER_MAX_S in all at most."""
        if self._arriving is None:
            return
        now = time.perf_counter()
        deadline, quiet_until = now + GATHER_MAX_S, now + GATHER_QUIET_S
        while not self._stop.is_set():
            now = time.perf_counter()
            left = (deadline if self._arriving() > 0 else min(deadline, quiet_until)) - now
            if left > 0:
                if self._take_commands(block=True, timeout=left):
                    quiet_until = time.perf_counter() + GATHER_QUIET_S
            elif self._more_after_settling(deadline - now):
                quiet_until = time.perf_counter() + GATHER_QUIET_S
            else:
                return

    def _more_after_settling(self, timeout: float) -> bool:
        """Whether requests came (submitted or counted) while the server caught up with what it had received."""
        if self._settle is None or timeout <= 0:
            return False
        self._settle(timeout)
        return self._take_commands(block=False) or self._arriving is not None and self._arriving() > 0

    def _take_commands(self, block: bool, timeout: float = 0.5) -> bool:
        """Run the queued commands (waiting ``timeout`` for the first if ``block``); whether there was one."""
        try:
            command = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return False
        while True:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, requests: list[Request], sink: Sink, stream: bool, submitted: float) -> None:
        idle = not self.engine.has_unfinished()
        self.seconds["queue_wait"] += (time.perf_counter() - submitted) * len(requests)
        for request in requests:
            if self._prepare is not None:
                self._prepare(request, idle)
            self._tracked[request.request_id] = _Tracked(sink, self.policy_version, stream, submitted)
            self.counters["requests"] += 1
            self.engine.add_request(request, self.policy_version)  # a rejected one comes back from the next step

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._tracked.pop(request_id, None) is not None:
                self.engine.abort(request_id)
                self.counters["aborted"] += 1

    def _step(self) -> None:
        started = time.perf_counter()
        try:
            self._step_events()
        finally:
            self.seconds["steps"] += time.perf_counter() - started
            self._flush()
            oldest = min((t.policy_version for t in self._tracked.values()), default=self.policy_version)
            self.version_lag = self.policy_version - oldest

    def _step_events(self) -> None:
        try:
            finished = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - the server reports it to every request and keeps running
            self._fail_all(f"the engine failed: {exc}")
            self.last_error = traceback.format_exc()
            return
        self.last_error = None  # a step went through: healthy again
        self._send_progress()
        for rollout in finished:
            tracked = self._tracked.pop(rollout.request_id, None)
            if tracked is None:
                continue  # aborted meanwhile
            self._count_tokens(len(rollout.completion_ids) - tracked.sent)
            self.counters["finished"] += 1
            self._post(tracked.sink, Finished(rollout, self.policy_version))

    def _send_progress(self) -> None:
        sent = {request_id: tracked.sent for request_id, tracked in self._tracked.items() if tracked.stream}
        if not sent:
            return
        for request_id, new_ids, new_lps in self.engine.progress(sent):  # only the tokens not sent yet
            tracked = self._tracked.get(request_id)
            if tracked is None or not tracked.stream or not new_ids:
                continue
            self._count_tokens(len(new_ids))
            if not tracked.sent:
                self.counters["first_tokens"] += 1
                self.seconds["first_token"] += time.perf_counter() - tracked.submitted
            tracked.sent += len(new_ids)
            self._post(tracked.sink, TokenDelta(request_id, new_ids, new_lps, tracked.policy_version))

    def _count_tokens(self, n: int) -> None:
        if n <= 0:
            return
        self.counters["generated_tokens"] += n
        now = time.perf_counter()
        with self._rate_lock:
            self._emitted.append((now, n))
            while self._emitted and now - self._emitted[0][0] > self._rate_window_s:
                self._emitted.popleft()

    def _fail_all(self, message: str) -> None:
        for request_id, tracked in list(self._tracked.items()):
            self.engine.abort(request_id)
            self.counters["failed"] += 1
            self._post(tracked.sink, Failed(request_id, message))
        self._tracked.clear()

    def _post(self, sink: Sink, event: Event) -> None:
        self._outbox.setdefault(id(sink), (sink, []))[1].append(event)

    def _flush(self) -> None:
        """Hand this step's events over: plain sinks one call each, asyncio sinks one hop per event loop."""
        outbox, self._outbox = self._outbox, {}
        by_loop: dict[Any, list[tuple[Any, list[Event]]]] = {}
        for sink, events in outbox.values():
            loop = getattr(sink, "event_loop", None)
            if loop is None:
                sink(events)
            else:
                by_loop.setdefault(loop, []).append((sink, events))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the event loop is closed: the server is shutting down
                pass


def _deliver(batch: list[tuple[Any, list[Event]]]) -> None:
    """On an event loop: each asyncio sink's events of one step."""
    for sink, events in batch:
        sink.deliver(events)
