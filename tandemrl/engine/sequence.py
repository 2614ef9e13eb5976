"""One sequence being generated: its tokens, its KV blocks and its sampling state (the engine's shared contract).

KV slot of token t: ``block_table[t // block_size] * block_size + t % block_size``. A prefill step computes
``token_ids[num_cached_tokens:]``; a decode step computes the last token only (position ``num_tokens - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tandemrl.types import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    token_ids: list[int]  # prompt + generated so far
    num_prompt_tokens: int
    params: SamplingParams
    policy_version: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)  # physical KV block ids, in order
    num_cached_tokens: int = 0  # leading tokens whose KV is already in the cache (prefix-cache hits)
    logprobs: list[float] = field(default_factory=list)  # one per generated token
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def num_blocks(self, block_size: int) -> int:
        """Blocks needed to hold all current tokens."""
        return (len(self.token_ids) + block_size - 1) // block_size

    def append_token(self, token_id: int, logprob: float) -> None:
        self.token_ids.append(int(token_id))
        self.logprobs.append(float(logprob))
