"""Drivers of the trajectory state machine (trajectory.py) over an ``LLMEngine``.

``AgentLoop.run``: each trajectory advances on its own. A finished turn with tool calls goes to a thread pool; the
engine keeps stepping the other trajectories meanwhile; when a tool returns, the trajectory's next turn is queued
with prompt = history + result tokens, and its history's KV blocks (registered in the prefix cache when the turn
finished) are reused rather than prefilled again. The engine idles only when every live trajectory waits on a
tool.

``AgentLoop.run_turn_synchronous``: the batch-synchronous baseline (generate every live trajectory's turn, run all
their tools concurrently, wait for all, repeat): every turn waits for the slowest sequence and the slowest tool.
Same state machine, same engine; the benchmark compares the two.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from tandemrl.engine.engine import LLMEngine
from tandemrl.rollout.tool_format import ToolFormat
from tandemrl.rollout.tools import ToolContext, ToolRegistry, ToolResult
from tandemrl.rollout.trajectory import AgentLimits, Phase, TrajectorySpec, TrajectoryState, run_calls
from tandemrl.types import Request, Rollout, Trajectory


class TurnEngine(Protocol):
    """What the loop drives: an ``LLMEngine``, or the same surface over a server (backends/server_turns.py), which
    also names the model's end-of-turn tokens."""

    eos_ids: frozenset[int]

    def add_request(self, request: Request, policy_version: int = 0) -> Any: ...

    def step(self) -> list[Rollout]: ...

    def has_unfinished(self) -> bool: ...

    def abort(self, request_id: str) -> bool: ...

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]: ...

    def close(self) -> None: ...


@dataclass
class LoopTimes:
    """Where a run's wall time went: ``engine_busy_s`` is time inside the engine (``step`` / ``generate`` calls)."""

    wall_s: float = 0.0
    engine_busy_s: float = 0.0
    engine_calls: int = 0

    @property
    def busy_fraction(self) -> float:
        return self.engine_busy_s / self.wall_s if self.wall_s > 0 else 0.0


class AgentLoop:
    """Runs trajectories over one engine: ``run`` (each at its own pace) or ``run_turn_synchronous`` (the
    baseline). ``call_tool`` replaces the registry's dispatch (tests, benchmarks)."""

    def __init__(self, engine: LLMEngine | TurnEngine, tokenizer: Any, fmt: ToolFormat, tools: ToolRegistry,
                 limits: AgentLimits | None = None, max_concurrent_tools: int = 64,
                 call_tool: Callable[[str, Any, ToolContext], ToolResult] | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.tools = tools
        self.limits = limits or AgentLimits()
        self.limits.validate()
        self.max_concurrent_tools = max_concurrent_tools
        self.call_tool = call_tool or tools.call
        # LLMEngine's scheduler holds its end-of-turn ids; another TurnEngine has them itself
        self.eos_ids = frozenset(engine.scheduler.eos_ids if isinstance(engine, LLMEngine) else engine.eos_ids)
        self.times = LoopTimes()

    def close(self) -> None:
        """Release what the turns hold (a server's: its HTTP client); an ``LLMEngine`` is its backend's to close."""
        if not isinstance(self.engine, LLMEngine):
            self.engine.close()

    # ------------------------------------------------------------------ the asynchronous loop

    def run(self, specs: Sequence[TrajectorySpec], policy_version: int = 0) -> list[Trajectory]:
        """Every trajectory to the end, each at its own pace; results in ``specs`` order."""
        states = self._states(specs, policy_version)
        by_request: dict[str, TrajectoryState] = {}
        tools: dict[Future, TrajectoryState] = {}
        started, self.times = time.perf_counter(), LoopTimes()
        with ThreadPoolExecutor(self.max_concurrent_tools, thread_name_prefix="tool") as pool:
            try:
                for state in states:
                    self._submit_turn(state, by_request)
                while by_request or tools:
                    for future in [f for f in tools if f.done()]:
                        self._resume(tools.pop(future), future.result(), by_request)
                    if self.engine.has_unfinished():
                        for rollout in self._timed(self.engine.step):
                            state = by_request.pop(rollout.request_id, None)
                            if state is not None:  # another caller's request finished meanwhile: not ours
                                self._turn_done(state, rollout, pool, tools)
                    elif tools:
                        wait(tools, return_when=FIRST_COMPLETED)
                    elif by_request:  # add_request queues every request, even a rejected one: cannot happen
                        raise RuntimeError(f"the engine lost requests {sorted(by_request)[:4]}")
            except BaseException:
                for request_id in by_request:
                    self.engine.abort(request_id)
                raise
        self.times.wall_s = time.perf_counter() - started
        return [s.result(self._decode) for s in states]

    def _submit_turn(self, state: TrajectoryState, by_request: dict[str, TrajectoryState]) -> None:
        request = state.next_request()
        by_request[request.request_id] = state
        self.engine.add_request(request, state.policy_version)  # a rejected one comes back from step() as error

    def _turn_done(self, state: TrajectoryState, rollout: Rollout, pool: ThreadPoolExecutor,
                   tools: dict[Future, TrajectoryState]) -> None:
        state.on_turn(rollout, self._turn_text(rollout), self._ended_by_eos(rollout))
        if state.phase is Phase.CALLING_TOOL:
            tools[pool.submit(run_calls, state.pending_calls, self.call_tool, state.spec.context)] = state

    def _resume(self, state: TrajectoryState, results: list[ToolResult],
                by_request: dict[str, TrajectoryState]) -> None:
        state.on_results(results, self._encode)
        if state.phase is Phase.GENERATING:
            self._submit_turn(state, by_request)

    # ------------------------------------------------------------------ the batch-synchronous baseline

    def run_turn_synchronous(self, specs: Sequence[TrajectorySpec], policy_version: int = 0) -> list[Trajectory]:
        """Turn by turn for the whole batch: generate all, then all tools (concurrently), then the next turn."""
        states = self._states(specs, policy_version)
        started, self.times = time.perf_counter(), LoopTimes()
        with ThreadPoolExecutor(self.max_concurrent_tools, thread_name_prefix="tool") as pool:
            live = list(states)
            while live:
                rollouts = self._timed(self.engine.generate, [s.next_request() for s in live], policy_version)
                for state, rollout in zip(live, rollouts):
                    state.on_turn(rollout, self._turn_text(rollout), self._ended_by_eos(rollout))
                calling = [s for s in live if s.phase is Phase.CALLING_TOOL]
                futures = [pool.submit(run_calls, s.pending_calls, self.call_tool, s.spec.context) for s in calling]
                for state, future in zip(calling, futures):  # waits for the slowest tool of the batch
                    state.on_results(future.result(), self._encode)
                live = [s for s in live if s.phase is Phase.GENERATING]
        self.times.wall_s = time.perf_counter() - started
        return [s.result(self._decode) for s in states]

    # ------------------------------------------------------------------ helpers

    def _timed(self, engine_call: Callable[..., list[Rollout]], *args: Any) -> list[Rollout]:
        started = time.perf_counter()
        try:
            return engine_call(*args)
        finally:
            self.times.engine_busy_s += time.perf_counter() - started
            self.times.engine_calls += 1

    def _states(self, specs: Sequence[TrajectorySpec], policy_version: int) -> list[TrajectoryState]:
        ids = [s.traj_id for s in specs]
        if len(set(ids)) != len(ids):
            raise ValueError("trajectory ids must be unique within one run")
        return [TrajectoryState(spec, self.fmt, self.limits, policy_version) for spec in specs]

    def _turn_text(self, rollout: Rollout) -> str:
        """The turn as written, special tokens kept (``<tool_call>`` may be one); not cut at stop strings."""
        return self.tokenizer.decode(rollout.completion_ids, skip_special_tokens=False)

    def _ended_by_eos(self, rollout: Rollout) -> bool:
        return bool(rollout.completion_ids) and rollout.completion_ids[-1] in self.eos_ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)
