"""Sampling for the runner's steps: per-row sampling columns on the device, and the seeded streams kept across
steps (so a seeded run with the same schedule reproduces its tokens).

The fused Triton sampler (one read of the logits; temperature only) serves batches without top-k/top-p on CUDA;
the others use the torch sampler (sampler.py).
"""

from __future__ import annotations

import functools
import random
from typing import Callable, Sequence as Seq

import torch
from torch import Tensor

from tandemrl.engine.kernels.triton_sampler import fused_sample, fused_sample_available
from tandemrl.engine.model.pending import copy_to_device
from tandemrl.engine.model.sampler import sample_tokens
from tandemrl.engine.sequence import Sequence
from tandemrl.types import SamplingParams


class StepSampler:
    """Builds the sampling function of each step from its rows' SamplingParams; see the module docstring."""

    def __init__(self, device: torch.device, fused_kernels: bool) -> None:
        self.device = device
        self.fused_kernels = fused_kernels
        self._columns_cache: tuple[tuple, tuple[Tensor, ...]] | None = None  # last batch's sampling columns
        self._rng: tuple[int, torch.Generator] | None = None
        self._seed_stream: tuple[int, random.Random] | None = None

    def reset(self) -> None:
        """Forget the seeded generators: the next seeded step starts its stream afresh (call at each new run)."""
        self._rng = None
        self._seed_stream = None

    def for_subsets(self, seqs: Seq[Sequence], temperature_only: bool = False
                    ) -> Callable[[Tensor, Tensor | slice], tuple[Tensor, Tensor]]:
        """(logits [R, vocab], rows [R] on the device: which of ``seqs`` each logits row is, or ``slice(None)``: all)
        -> (tokens, log-probs), set up once per burst. The fused Triton sampler (one read of the logits) when no row
        filters with top-k/top-p on CUDA. ``temperature_only``: top-k/top-p ignored, every row draws from
        ``softmax(logits / T)`` (a speculative draft: the rejection rule reads that distribution)."""
        params = [seq.params for seq in seqs]
        temperature, top_p, top_k = self._columns(params)
        filters = not temperature_only and any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in params)
        if self.fused and not filters:
            next_seed = self._seed_source(params)  # one read of the logits instead of a dozen passes
            return lambda logits, rows: fused_sample(logits, temperature[rows], next_seed())
        generator = self._generator(params)
        return lambda logits, rows: sample_tokens(logits, temperature[rows], top_p[rows], top_k[rows], generator,
                                                  apply_filters=filters)

    @property
    def fused(self) -> bool:
        """Whether the fused Triton kernels sample (and score) here: enabled, Triton present, a CUDA device."""
        return self.fused_kernels and fused_sample_available(self.device)

    def temperatures(self, seqs: Seq[Sequence]) -> Tensor:
        """[B] float32 on the device."""
        return self._columns([seq.params for seq in seqs])[0]

    def generator(self, seqs: Seq[Sequence]) -> torch.Generator | None:
        """The torch generator of these rows (seeded by the first seeded one), for samplers beside ``for_subsets``."""
        return self._generator([seq.params for seq in seqs])

    def _columns(self, params: list[SamplingParams]) -> tuple[Tensor, ...]:
        """Per-row temperature, top_p (float32) and top_k (long) on the device: one copy, and none at all while
        the batch's values stay the same (decode steps of the same requests)."""
        key = tuple((p.temperature, p.top_p, p.top_k) for p in params)
        cached = self._columns_cache
        if cached is None or cached[0] != key:
            host = copy_to_device(torch.tensor(key, dtype=torch.float64).t(), self.device)  # float64: any top_k
            cached = self._columns_cache = (key, (host[0].float(), host[1].float(), host[2].long()))
        return cached[1]

    def _seed_source(self, params: list[SamplingParams]) -> Callable[[], int]:
        """Per-step seeds of the fused sampler, drawn on the host (no device sync): a stream seeded by the first
        seeded sequence and kept across steps, like ``_generator``; else torch's global CPU generator."""
        seed = next((p.seed for p in params if p.seed is not None), None)
        if seed is None:
            return lambda: int(torch.randint(0, 2**62, ()))
        if self._seed_stream is None or self._seed_stream[0] != seed:
            self._seed_stream = (seed, random.Random(int(seed)))
        return functools.partial(self._seed_stream[1].getrandbits, 62)

    def _generator(self, params: list[SamplingParams]) -> torch.Generator | None:
        """One generator, seeded from the first seeded sequence and kept across steps (reseeded when that seed
        changes), so a seeded run with the same schedule reproduces its tokens."""
        seed = next((p.seed for p in params if p.seed is not None), None)
        if seed is None:
            return None
        if self._rng is None or self._rng[0] != seed:
            self._rng = (seed, torch.Generator(device=self.device).manual_seed(int(seed)))
        return self._rng[1]
