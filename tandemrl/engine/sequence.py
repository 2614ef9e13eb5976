"""One sequence being generated: its tokens, its KV blocks and its sampling state (the engine's shared contract).

KV slot of token t: ``block_table[t // block_size] * block_size + t % block_size``. A prefill step computes
``token_ids[num_cached_tokens:]``; a decode step computes the last token only (position ``num_tokens - 1``).

With asynchronous scheduling the engine launches a step before the previous one's tokens reach the host: the last
``num_pending`` entries of ``token_ids`` (and of ``logprobs``) are then placeholders for tokens already sampled on
the device. Positions, block needs and ``max_tokens`` count them; nothing reads their values on the host.

``version_runs``: which policy version sampled each completion token, as (first completion index, version) pairs, one
per change of version: a step reserves its placeholders under the version it was launched with (the engine's at
launch), so tokens read back after a weight swap still count for the weights that computed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from tandemrl.types import RequestStats, SamplingParams


PENDING_TOKEN = -1  # a token id no vocabulary has: the placeholder of a token not read back yet


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
    num_pending: int = 0  # trailing placeholders for tokens sampled on the device, not yet read back
    # Tokens whose K/V every model slot holds (None: all). A tandem engine's request outside tandem, decoded by the
    # hot model alone, stops it where that began: the prefix cache registers no block past it.
    kv_complete_tokens: int | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    version_runs: list[tuple[int, int]] = field(default_factory=list)  # (first completion index, version)

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
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def num_blocks(self, block_size: int) -> int:
        """Blocks needed to hold all current tokens."""
        return (len(self.token_ids) + block_size - 1) // block_size

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids the host has (all but the pending placeholders)."""
        return len(self.token_ids) - self.num_pending

    def add_pending(self, n: int, version: int | None = None) -> None:
        """Reserve n placeholder tokens for a launched step whose sampled tokens have not been read back;
        ``version``: the policy version the step was launched under (None: placeholders put back behind a step)."""
        if version is not None:  # the tokens from the next completion index on are sampled by ``version``
            start, runs = self.num_completion_tokens, self.version_runs
            while runs and runs[-1][0] >= start:  # a step launched again where an abandoned one started
                del runs[-1]
            if not runs or runs[-1][1] != version:
                runs.append((start, version))
        self.token_ids.extend([PENDING_TOKEN] * n)
        self.logprobs.extend([math.nan] * n)
        self.num_pending += n

    def fill_pending(self, planned: int, token_ids: list[int], logprobs: list[float]) -> None:
        """Put a step's tokens in place of the ``planned`` oldest placeholders it reserved; it may have returned
        fewer or more (step.py)."""
        self._check_step(planned, len(token_ids))
        if len(token_ids) != len(logprobs):
            raise RuntimeError(f"sequence {self.seq_id} got {len(token_ids)} tokens and {len(logprobs)} log-probs")
        start = len(self.token_ids) - self.num_pending
        self.token_ids[start:start + planned] = token_ids
        first = start - self.num_prompt_tokens
        self.logprobs[first:first + planned] = logprobs
        self.num_pending -= planned

    def release_step(self, planned: int, arrived: int) -> int:
        """Drop every placeholder before the ``arrived`` tokens of a step that reserved ``planned`` are appended one
        by one; returns how many belong to later steps (to be put back behind them)."""
        self._check_step(planned, arrived)
        return self.drop_pending() - planned

    def _check_step(self, planned: int, arrived: int) -> None:
        """RuntimeError if the step reserved more placeholders than are pending, or if its count changed while a
        later step, whose positions assumed it, is in flight."""
        if planned > self.num_pending:
            raise RuntimeError(f"sequence {self.seq_id} got a step of {planned} tokens for {self.num_pending} "
                               f"pending placeholders")
        if arrived != planned and self.num_pending > planned:
            raise RuntimeError(f"sequence {self.seq_id} got {arrived} tokens for {planned} planned while a later "
                               f"step is in flight")

    def drop_pending(self) -> int:
        """Remove every placeholder (the step results are appended in their place); returns how many there were."""
        n = self.num_pending
        if n:
            del self.token_ids[-n:]
            del self.logprobs[-n:]
            self.num_pending = 0
        return n

    def append_token(self, token_id: int, logprob: float) -> None:
        self.token_ids.append(int(token_id))
        self.logprobs.append(float(logprob))
