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
    """One completion to produce from a tokenised prompt."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class Rollout:
    """One finished completion, as the rollout backend returns it."""

    request_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    finish_reason: str  # "stop" (EOS or stop string), "length", or "error"
    text: str = ""
    policy_version: int = 0
    error: str | None = None


@dataclass
class Sample:
    """One task item: the prompt text plus the columns rewards need (e.g. the gold answer)."""

    prompt: str
    answer: str
    index: int = 0
    columns: dict[str, Any] = field(default_factory=dict)
