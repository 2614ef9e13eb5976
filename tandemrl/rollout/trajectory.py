"""One trajectory's state machine over token ids: generating -> calling tool -> generating ... -> done.

Pure bookkeeping, no engine and no threads: the drivers (agent_loop.py) feed it each turn's engine output and each
batch of tool results. Token ids only ever grow by appending: a turn's output as the engine returned it (loss
weight 1) and the tokenised tool-result text (loss weight 0); nothing generated is decoded and encoded again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from tandemrl.rollout.tool_format import ToolCall, ToolFormat
from tandemrl.rollout.tools import ToolContext, ToolResult
from tandemrl.types import Request, RequestStats, Rollout, SamplingParams, ToolCallRecord, Trajectory


class Phase(str, Enum):
    GENERATING = "generating"
    CALLING_TOOL = "calling_tool"
    DONE = "done"


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int = 8  # generation turns per trajectory
    max_tool_calls: int = 8  # tool calls per trajectory
    max_total_tokens: int = 1024  # completion side: generated plus inserted tokens

    def validate(self) -> None:
        for name in ("max_turns", "max_tool_calls", "max_total_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"tools.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class TrajectorySpec:
    """What a trajectory starts from: its prompt ids, per-turn sampling params and the tools' context."""

    traj_id: str
    prompt_ids: list[int]
    params: SamplingParams
    context: ToolContext = field(default_factory=ToolContext)


@dataclass
class TrajectoryState:
    spec: TrajectorySpec
    fmt: ToolFormat
    limits: AgentLimits
    policy_version: int = 0  # what each turn is asked for
    token_versions: list[int] = field(default_factory=list)  # the version behind each completion token
    phase: Phase = Phase.GENERATING
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_weights: list[float] = field(default_factory=list)
    turns: int = 0
    pending_calls: list[ToolCall] = field(default_factory=list)
    records: list[ToolCallRecord] = field(default_factory=list)
    turn_stats: list[RequestStats] = field(default_factory=list)
    final_text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    inserted_tokens: int = 0
    reprefill_tokens: int = 0
    _just_inserted: int = 0  # tokens appended since the last turn (the part of the next prompt that is new)
    _ended_by_eos: bool = False  # the last turn closed itself with an end-of-turn token

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def next_request(self) -> Request:
        """The next turn: the whole history as the prompt (its cached blocks are reused), the turn's budget."""
        assert self.phase is Phase.GENERATING, self.phase
        budget = self.limits.max_total_tokens - len(self.completion_ids)
        params = dataclasses.replace(self.spec.params, max_tokens=min(self.spec.params.max_tokens, budget),
                                     stop=tuple(self.spec.params.stop) + tuple(self.fmt.stop))
        return Request(f"{self.spec.traj_id}#{self.turns}", self.spec.prompt_ids + self.completion_ids, params,
                       tandem=False)

    def on_turn(self, rollout: Rollout, turn_text: str, ended_by_eos: bool) -> None:
        """A turn finished: append its tokens, then parse it: calls -> CALLING_TOOL, none or a limit -> DONE.
        ``turn_text``: the turn's ids decoded with special tokens kept (calls may be spelled with them)."""
        assert self.phase is Phase.GENERATING, self.phase
        self.turns += 1
        self.turn_stats.append(rollout.stats)
        if rollout.error is not None:
            return self._finish("error", error=rollout.error)
        if self.turns > 1:  # history the cache did not serve, beyond the tokens inserted since the last turn
            missed = rollout.stats.prompt_tokens - rollout.stats.cached_prompt_tokens
            self.reprefill_tokens += max(0, missed - self._just_inserted)
        self.completion_ids += rollout.completion_ids
        self.logprobs += list(rollout.logprobs)
        self.loss_weights += rollout.token_weights()
        self.token_versions += rollout.token_versions()  # weights pushed between (or within) turns show here
        self.final_text = rollout.text
        self._ended_by_eos = ended_by_eos
        calls = self.fmt.parse(turn_text)
        if not calls:
            return self._finish(rollout.finish_reason)
        if len(self.records) + len(calls) > self.limits.max_tool_calls:
            return self._finish("max_tool_calls")
        if self.turns >= self.limits.max_turns:
            return self._finish("max_turns")
        self.pending_calls = calls
        self.phase = Phase.CALLING_TOOL

    def on_results(self, results: Sequence[ToolResult], encode: Callable[[str], list[int]]) -> None:
        """The pending calls' results: append their text's tokens (weight 0) and generate again, if they fit."""
        assert self.phase is Phase.CALLING_TOOL and len(results) == len(self.pending_calls)
        for call, result in zip(self.pending_calls, results):
            self.records.append(ToolCallRecord(call.name, call.arguments, result.text, result.error))
        self.pending_calls = []
        inserted = encode(self.fmt.result_text(results, self._ended_by_eos))
        if len(self.completion_ids) + len(inserted) >= self.limits.max_total_tokens:
            return self._finish("max_total_tokens")  # no room for the results and a turn after them
        self.completion_ids += inserted
        self.logprobs += [0.0] * len(inserted)
        self.loss_weights += [0.0] * len(inserted)
        # tool output (weight 0, never trained on) counts for the turn that called it: its version runs on
        self.token_versions += self.token_versions[-1:] * len(inserted)
        self.inserted_tokens += len(inserted)
        self._just_inserted = len(inserted)
        self.phase = Phase.GENERATING

    def _finish(self, reason: str, error: str | None = None) -> None:
        self.finish_reason, self.error, self.phase = reason, error, Phase.DONE

    def result(self, decode: Callable[[list[int]], str]) -> Trajectory:
        assert self.phase is Phase.DONE
        runs = version_runs(self.token_versions)
        rollout = Rollout(self.spec.traj_id, list(self.spec.prompt_ids), list(self.completion_ids),
                          list(self.logprobs), self.finish_reason or "stop", text=decode(self.completion_ids),
                          policy_version=runs[0][1] if runs else self.policy_version, error=self.error,
                          loss_weights=list(self.loss_weights),
                          stats=merge_stats(self.turn_stats, len(self.spec.prompt_ids)),
                          version_runs=runs if len(runs) > 1 else [])
        return Trajectory(rollout, self.final_text, self.turns, list(self.records), self.inserted_tokens,
                          self.reprefill_tokens)


def run_calls(calls: Sequence[ToolCall], call_tool: Callable[[str, Any, ToolContext], ToolResult],
              context: ToolContext) -> list[ToolResult]:
    """One turn's calls, in order; a call the format could not parse becomes its error message."""
    return [ToolResult(f"error: {c.error}", error=True) if c.error is not None
            else call_tool(c.name, c.arguments, context) for c in calls]


def version_runs(versions: Sequence[int]) -> list[tuple[int, int]]:
    """(first index, version) at each change of version, as ``Rollout.version_runs`` holds them."""
    return [(i, v) for i, v in enumerate(versions) if i == 0 or versions[i - 1] != v]


def merge_stats(turns: Sequence[RequestStats], prompt_tokens: int) -> RequestStats:
    """One RequestStats for the whole trajectory: first arrival to last token, tokens summed over turns."""
    if not turns:
        return RequestStats(prompt_tokens=prompt_tokens)
    first, last = turns[0], turns[-1]
    return RequestStats(
        arrival_time=first.arrival_time, first_scheduled_time=first.first_scheduled_time,
        first_token_time=first.first_token_time, finished_time=last.finished_time, prompt_tokens=prompt_tokens,
        generated_tokens=sum(s.generated_tokens for s in turns), cached_prompt_tokens=first.cached_prompt_tokens,
        peak_kv_blocks=max(s.peak_kv_blocks for s in turns), kv_block_bytes=first.kv_block_bytes,
        preemptions=sum(s.preemptions for s in turns), drafted_tokens=sum(s.drafted_tokens for s in turns),
        accepted_tokens=sum(s.accepted_tokens for s in turns))
