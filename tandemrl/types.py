"""Plain dataclasses shared by every layer: sampling, requests, rollouts, samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. temperature 0 means greedy."""

    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def validate(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be > 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")


@dataclass
class Request:
    """One completion to produce from a tokenised prompt. ``tandem``: whether a tandem engine may mix the frozen
    model's tokens into it (evaluation turns it off: it measures the trained model alone)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    tandem: bool = True


@dataclass
class RequestStats:
    """What serving one request cost: times (seconds, from the engine's clock), tokens, cache reuse, KV memory.

    Times are measured on the host when the engine learns of an event (a token is known once its step is read
    back), so they include the asynchronous scheduler's one step of delay. ``drafted_tokens``/``accepted_tokens``
    count speculative proposals and how many of them the target kept (0 without speculation);
    ``acceptance_histogram[a]`` counts the verify steps that kept ``a`` proposed tokens.
    """

    arrival_time: float = 0.0  # when the request was added
    first_scheduled_time: float | None = None  # when its first prefill was launched
    first_token_time: float | None = None  # when its first generated token reached the host
    finished_time: float | None = None  # when its last token reached the host
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served by the prefix cache (at the first prefill)
    kv_blocks: int = 0  # KV blocks held now (0 once finished)
    peak_kv_blocks: int = 0
    kv_block_bytes: int = 0  # bytes of one KV block over every model slot: blocks x this = KV memory
    preemptions: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_histogram: list[int] = field(default_factory=list)

    def record_verify(self, drafted: int, accepted: int) -> None:
        """One verify step of this request: ``drafted`` tokens proposed, ``accepted`` of them kept."""
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if len(self.acceptance_histogram) <= accepted:
            self.acceptance_histogram.extend([0] * (accepted + 1 - len(self.acceptance_histogram)))
        self.acceptance_histogram[accepted] += 1

    @property
    def verify_steps(self) -> int:
        return sum(self.acceptance_histogram)

    @property
    def queue_time(self) -> float:
        return _elapsed(self.arrival_time, self.first_scheduled_time)

    @property
    def time_to_first_token(self) -> float:
        return _elapsed(self.arrival_time, self.first_token_time)

    @property
    def latency(self) -> float:
        """Arrival to the last token."""
        return _elapsed(self.arrival_time, self.finished_time)

    @property
    def peak_kv_mb(self) -> float:
        return self.peak_kv_blocks * self.kv_block_bytes / 2**20

    @property
    def kv_mb(self) -> float:
        return self.kv_blocks * self.kv_block_bytes / 2**20

    @property
    def cache_hit_ratio(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens each verify step produced: the kept proposals plus the target's own token (0 without any)."""
        steps = self.verify_steps
        return (self.accepted_tokens + steps) / steps if steps else 0.0


def _elapsed(start: float, end: float | None) -> float:
    return end - start if end is not None else 0.0


@dataclass
class Rollout:
    """One finished completion, as the rollout backend returns it.

    ``logprobs[i]`` is the log-prob of ``completion_ids[i]`` under the distribution it was sampled from (after
    temperature; top-k/top-p renormalised). ``loss_weights[i]`` is that token's weight in the loss: 1.0 for tokens
    the trained policy wrote; tandem rollouts give frozen-written tokens less, tool output gets 0. Empty means all
    1.0. ``policy_version`` names the weights that sampled it: its oldest token's where the weights changed while it
    ran. ``version_runs``: (first completion index, version) at each change of version, in order (empty: every
    token was sampled by ``policy_version``); ``token_versions()`` expands them to one version per token.
    """

    request_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    finish_reason: str  # "stop" (EOS or stop string), "length", or "error"
    text: str = ""
    policy_version: int = 0
    error: str | None = None
    loss_weights: list[float] = field(default_factory=list)  # per completion token; empty = all 1.0
    stats: RequestStats = field(default_factory=RequestStats)
    token_sources: list[bool] = field(default_factory=list)  # tandem: True where the trained model wrote the token
    version_runs: list[tuple[int, int]] = field(default_factory=list)  # (first completion index, version)

    def token_versions(self) -> list[int]:
        """The policy version that sampled each completion token."""
        n = len(self.completion_ids)
        if not self.version_runs:
            return [self.policy_version] * n
        versions: list[int] = []
        ends = [start for start, _ in self.version_runs[1:]] + [n]
        for (start, version), end in zip(self.version_runs, ends):
            versions += [version] * (min(end, n) - start)
        return versions

    def token_weights(self) -> list[float]:
        """The loss weight of every completion token (1.0 where none was set)."""
        if not self.loss_weights:
            return [1.0] * len(self.completion_ids)
        if len(self.loss_weights) != len(self.completion_ids):
            raise ValueError(f"rollout {self.request_id}: {len(self.loss_weights)} loss weights for "
                             f"{len(self.completion_ids)} completion tokens")
        return list(self.loss_weights)


@dataclass
class ToolCallRecord:
    """One tool call of a trajectory: what the model asked for and what it was told."""

    name: str
    arguments: Any
    result: str
    error: bool


@dataclass
class Trajectory:
    """A finished multi-turn rollout. ``rollout.completion_ids`` is every turn's engine output and every inserted
    tool-result token, in order; ``rollout.loss_weights`` is 1.0 on the model's tokens and 0.0 on inserted ones
    (whose ``logprobs`` are 0.0); ``rollout.version_runs`` are each turn's own (an inserted token counts for the turn
    that called the tool); ``rollout.text`` is the whole transcript. ``final_text`` is the last turn's text
    (the answer rewards check); ``reprefill_tokens`` counts history tokens recomputed when turns resumed (prompt
    tokens the prefix cache did not serve, less the newly inserted ones)."""

    rollout: Rollout
    final_text: str
    turns: int
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    inserted_tokens: int = 0
    reprefill_tokens: int = 0

    @property
    def tool_errors(self) -> int:
        return sum(call.error for call in self.tool_calls)


@dataclass
class Sample:
    """One task item: the prompt (text, or chat messages ``[{"role": ..., "content": ...}]``), the gold answer of
    the built-in tasks (None for a user's dataset, whose columns hold whatever its rewards need) and the other
    columns, which reach the reward functions by name. ``source`` names the file and row it came from."""

    prompt: str | list[dict[str, Any]]
    answer: str | None = None
    index: int = 0
    columns: dict[str, Any] = field(default_factory=dict)
    source: str = ""
