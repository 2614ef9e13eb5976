"""The server's start-up warm-up: before it listens, its engine runs one batch of dummy requests per CUDA graph batch
bucket, so no client pays for a graph capture or a Triton compile.

The engine captures a decode graph (and Triton compiles a kernel specialization) the first time it meets a batch
size bucket. Clients arrive one by one, so a server's first batches are small ones of whatever size the first
arrivals happened to form: unwarmed, such a batch stalls every request queued behind it for its capture and compiles
(what bench/serve.py's 64 clients, each ~0.6 s later to its first token on one machine, look like; issue 40). An
in-process ``generate`` meets only the batch size it is given.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.model.cuda_graphs import BATCH_BUCKETS
from tandemrl.types import Request, SamplingParams

PROMPT_TOKENS = 17  # neither 1 nor a multiple of 16: Triton's general specialization of a length


@dataclass
class WarmUp:
    batches: list[int]  # the batch sizes run, one per bucket
    seconds: float


def warm_up(engine: LLMEngine, vocab_size: int) -> WarmUp:
    """Run a batch of every bucket up to ``engine.config.max_num_seqs`` (at most the largest bucket) through
    ``engine`` (a prefill, then a whole decode burst), on distinct random prompts; then forget their prefix-cache
    blocks. Call it before the engine serves anyone: it steps the engine to completion."""
    started = time.perf_counter()
    limit = min(engine.config.max_num_seqs, BATCH_BUCKETS[-1])  # larger batches run eagerly: nothing to capture
    batches = [b for b in BATCH_BUCKETS if b < limit] + [limit]
    params = SamplingParams(max_tokens=engine.config.decode_steps + 1, temperature=1.0, ignore_eos=True)
    generator = torch.Generator().manual_seed(0)
    for size in batches:
        prompts = torch.randint(0, vocab_size, (size, PROMPT_TOKENS), generator=generator).tolist()
        engine.generate([Request(f"warm-up-{size}-{i}", p, params) for i, p in enumerate(prompts)])
    engine.invalidate_prefix_cache()
    return WarmUp(batches, time.perf_counter() - started)
