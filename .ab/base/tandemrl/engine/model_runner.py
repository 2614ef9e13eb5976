"""The model runner: owns the paged KV cache, turns scheduled Sequences into one forward, samples the next tokens.

`launch(seqs, steps, is_prefill)` builds packed input ids, positions, slot mappings and block tables from the
Sequence objects, runs `forward.forward_hidden` over the trainer's own modules (zero copy) under inference mode
with the model in eval mode, takes logits of the sampled positions only, and samples with the shared sampler; it
returns before the device is done (pending.py). A decode launch is a burst of steps (decode_plan.py): each step's
sampled tokens are the next step's input on the device, so the burst syncs with the host once, when its tokens
are read back. On CUDA, decode replays CUDA graphs captured per batch bucket (see cuda_graphs.py). `run` and
`decode` are the same launches, waited for.

The cache holds one extra block past `num_blocks` (the scratch block): CUDA-graph padding rows and the dead steps
of a burst write there, so block ids 0 .. num_blocks-1 all belong to the block manager.
"""

from __future__ import annotations

import contextlib
import functools
import random
from typing import Callable, Iterator, Sequence as Seq

import numpy as np
import torch
from torch import Tensor, nn

from tandemrl.backends.sampler import sample_tokens
from tandemrl.engine.attention import DecodeMeta, build_prefill_meta
from tandemrl.engine.compile import CompiledDecode
from tandemrl.engine.cuda_graphs import DecodeGraphs, batch_bucket
from tandemrl.engine.decode_plan import DecodePlan, build_decode_plan
from tandemrl.engine.fused import fused_available
from tandemrl.engine.forward import compute_logits, forward_hidden, inspect_decoder
from tandemrl.engine.pending import LastSamples, PendingTokens, copy_to_device, link_pending, resolve_pending
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.triton_attention import triton_decode_available
from tandemrl.engine.triton_sampler import fused_sample, fused_sample_available
from tandemrl.types import SamplingParams

StepFn = Callable[[int, "Tensor | None"], Tensor]  # (step j, its input ids or None for the staged ones) -> hidden
CPU_KV_BUDGET_BYTES = 256 * 1024 * 1024
# Kept free on the GPU beside the cache: the sampler's [rows, vocab] float32 temporaries for a full decode batch
# (about a dozen of them, sort indices included) plus a fixed slack for prefill activations and graph pools.
_SAMPLER_ROWS, _SAMPLER_TEMPS, _SLACK_BYTES = 256, 12, 512 * 1024 * 1024


class ModelRunner:
    """Forward + sampling over a paged KV cache for Qwen2/Qwen3/Llama/Mistral models (maybe peft-wrapped).

    model: the trainer's model, used in place. device: where the model lives (default: its embedding's device).
    max_model_len: longest sequence (default the config's max_position_embeddings). enforce_eager: no CUDA
    graphs. attention_backend: "auto" (Triton decode kernel on CUDA when available), "triton" or "sdpa".
    compile_decode: compile the graphed decode forward with torch.compile before capture (CUDA graphs only;
    falls back to eager with a warning if compilation fails, see compile.py; the compiled decode forward uses torch
    ops instead of fused.py/fused_linear.py, which inductor fuses itself). fused_kernels: the Triton kernels of
    fused.py (RMSNorm + residual add, RoPE with the K/V store, SiLU product), fused_linear.py (q/k/v and gate/up
    in one launch each) and triton_sampler.py (temperature sampling from one read of the logits; top-k/top-p
    batches keep the torch sampler) on CUDA when Triton is importable; CPU keeps torch ops.
    """

    def __init__(
        self, model: nn.Module, device: torch.device | str | None = None, block_size: int = 16, *,
        max_model_len: int | None = None, enforce_eager: bool = False, attention_backend: str = "auto",
        compile_decode: bool = False, fused_kernels: bool = True,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.model = model
        self.spec = inspect_decoder(model)
        self.device = torch.device(device) if device is not None else self.spec.device
        self.block_size = block_size
        self.max_model_len = int(max_model_len or self.spec.max_position_embeddings or 4096)
        self.enforce_eager = enforce_eager or self.device.type != "cuda"
        self.use_triton = _pick_backend(attention_backend, self.device)
        self.fused_kernels = bool(fused_kernels) and fused_available(self.device)
        self.compile_decode = compile_decode and self.device.type == "cuda"  # CPU keeps the eager forward
        self._compiled: CompiledDecode | None = None  # kept across cache reallocations: compiled once
        self._sample_cols: tuple[tuple, tuple[Tensor, ...]] | None = None  # last batch's sampling columns
        self.num_blocks = 0
        self.k_caches: list[Tensor] = []
        self.v_caches: list[Tensor] = []
        self._graphs: DecodeGraphs | None = None
        self._last: LastSamples | None = None  # the latest launch's tokens: pending ones are fed from here
        # One warm-up stream for every capture: each new stream costs a cuBLAS workspace that is never freed
        # (32 MiB per sleep/wake cycle of a GRPO run on an H100 before this).
        self._warmup_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._rng: tuple[int, torch.Generator] | None = None
        self._seed_stream: tuple[int, random.Random] | None = None
        self._modules = list(model.modules())

    # ------------------------------------------------------------------ KV cache

    def bytes_per_block(self, block_size: int | None = None) -> int:
        """K and V of every layer for one block."""
        s = self.spec
        elem = torch.empty((), dtype=s.dtype).element_size()
        return 2 * s.num_layers * (block_size or self.block_size) * s.num_kv_heads * s.head_dim * elem

    def num_blocks_that_fit(self, block_size: int, gpu_memory_utilization: float) -> int:
        """Blocks the cache may have. CUDA: a `gpu_memory_utilization` share of the device's memory, bounded by
        what is free now (the trainer's tensors stay where they are) minus room for activations; CPU: 256 MiB."""
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            reserve = _SAMPLER_ROWS * _SAMPLER_TEMPS * self.spec.vocab_size * 4 + _SLACK_BYTES
            budget = min(gpu_memory_utilization * total, free - reserve)
        else:
            budget = CPU_KV_BUDGET_BYTES
        return max(0, int(budget // self.bytes_per_block(block_size)) - 1)  # minus the scratch block

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate (zeroed, so masked-out slots are finite) K/V for `num_blocks` blocks plus the scratch block."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.free_kv_cache()
        s = self.spec
        shape = (2, s.num_layers, num_blocks + 1, self.block_size, s.num_kv_heads, s.head_dim)
        kv = torch.zeros(shape, dtype=s.dtype, device=self.device)
        self.k_caches = list(kv[0].unbind(0))
        self.v_caches = list(kv[1].unbind(0))
        self.num_blocks = num_blocks

    def free_kv_cache(self) -> None:
        """Drop the cache and the CUDA graphs (their buffers and pool). The memory goes back to PyTorch's caching
        allocator, where the trainer of this process reuses it; emptying that cache on every sleep would make the
        next update allocate from the device again (0.37 s of a 1.98 s GRPO step on an H100, 2026-11-22)."""
        self._graphs = None
        self._last = None
        self.k_caches, self.v_caches = [], []
        self.num_blocks = 0

    def reset_rng(self) -> None:
        """Forget the seeded generators: the next seeded step starts its stream afresh (call at each new run)."""
        self._rng = None
        self._seed_stream = None

    # ------------------------------------------------------------------ one step

    def launch(self, seqs: Seq[Sequence], steps: Seq[int], is_prefill: bool) -> PendingTokens:
        """Start a prefill (one token per sequence; `steps` all 1) or a decode burst (see decode_plan.py: sequence i
        computes ``steps[i]`` tokens, each step feeding the token sampled at the previous one) and return without
        waiting for the device. A sequence's pending tokens (sequence.py) must come from the previous launch: the
        last one is fed to this one on the device."""
        if not seqs:
            raise ValueError("launch needs at least one sequence")
        self._require_cache()
        with _eval_mode(self._modules), torch.inference_mode():
            if is_prefill:
                tokens, logprobs = self._sampler(seqs)(compute_logits(self.spec, self._prefill(seqs)))
                tokens, logprobs = tokens[:, None], logprobs[:, None]
            else:
                tokens, logprobs = self._decode_burst(seqs, steps)
            self._last = LastSamples.of(seqs, steps, tokens)
            return PendingTokens(tokens, logprobs, steps)

    def run(self, seqs: Seq[Sequence], is_prefill: bool) -> tuple[list[int], list[float]]:
        """One forward for `seqs` and one sampled token per sequence, waited for: (token ids, their log-probs)."""
        if not seqs:
            return [], []
        tokens, logprobs = self.launch(seqs, [1] * len(seqs), is_prefill).result()
        return [t[0] for t in tokens], [lp[0] for lp in logprobs]

    def decode(self, seqs: Seq[Sequence], steps: Seq[int]) -> tuple[list[list[int]], list[list[float]]]:
        """A decode burst, waited for: per sequence its tokens and their log-probs."""
        if not seqs:
            return [], []
        return self.launch(seqs, steps, False).result()

    def _decode_burst(self, seqs: Seq[Sequence], steps: Seq[int]) -> tuple[Tensor, Tensor]:
        """[B, K] tokens and log-probs of a burst, left on the device (no host sync)."""
        plan = build_decode_plan(seqs, steps, self.block_size, self.num_blocks, self.max_model_len)
        linked = link_pending(plan.ids, seqs, self._last)
        run_step, staged_ids = self._graph_steps(plan) if self._use_graphs(len(seqs)) else self._eager_steps(plan)
        tokens = resolve_pending(staged_ids, self._last) if linked else None
        sample = self._sampler(seqs)
        all_tokens, all_logprobs = [], []
        for j in range(plan.num_steps):
            tokens, logprobs = sample(compute_logits(self.spec, run_step(j, tokens)))
            all_tokens.append(tokens)  # stacked once after the loop: no extra launches per step
            all_logprobs.append(logprobs)
        return torch.stack(all_tokens, 1), torch.stack(all_logprobs, 1)

    def _require_cache(self) -> None:
        if not self.k_caches:
            raise RuntimeError("ModelRunner has no KV cache: call allocate_kv_cache(num_blocks) first")

    def _use_graphs(self, batch: int) -> bool:
        return not self.enforce_eager and batch_bucket(batch) is not None

    def _graph_steps(self, plan: DecodePlan) -> tuple[StepFn, Tensor]:
        """(step j's forward, the staged step-0 input ids on the device)."""
        graphs = self._decode_graphs()
        graphs.stage(plan)
        return graphs.step, graphs.staged_ids()

    def _eager_steps(self, plan: DecodePlan) -> tuple[StepFn, Tensor]:
        """Step j's forward without graphs, and the step-0 input ids; the burst's columns go to the device at once."""
        columns = copy_to_device(torch.from_numpy(np.stack((plan.positions, plan.slots, plan.context_lens))),
                                 self.device)
        tables = copy_to_device(torch.from_numpy(plan.tables), self.device)
        first_ids = copy_to_device(torch.from_numpy(plan.ids), self.device)

        def run_step(j: int, input_ids: Tensor | None) -> Tensor:
            positions, slots, context_lens = columns[:, j].unbind(0)
            meta = DecodeMeta(positions=positions, slot_mapping=slots, context_lens=context_lens,
                              block_tables=tables, use_triton=self.use_triton)
            ids = first_ids if input_ids is None else input_ids
            return forward_hidden(self.spec, ids, meta, self.k_caches, self.v_caches, fused=self.fused_kernels)

        return run_step, first_ids

    def _prefill(self, seqs: Seq[Sequence]) -> Tensor:
        ids: list[int] = []
        query_lens, context_lens = [], []
        for seq in seqs:
            self._check(seq)
            # A fully cached sequence still recomputes its last token: we need that position's logits.
            start = min(seq.num_cached_tokens, seq.num_tokens - 1)
            ids.extend(seq.token_ids[start:])
            query_lens.append(seq.num_tokens - start)
            context_lens.append(seq.num_tokens)
        meta = build_prefill_meta(query_lens, context_lens, self._block_tables(seqs), self.block_size, self.device,
                                  use_triton=self.use_triton)
        input_ids = copy_to_device(torch.tensor(ids, dtype=torch.long), self.device)
        return forward_hidden(self.spec, input_ids, meta, self.k_caches, self.v_caches, rows=meta.last_rows,
                              fused=self.fused_kernels)

    def _decode_graphs(self) -> DecodeGraphs:
        if self._graphs is None:
            self._graphs = DecodeGraphs(
                self._graph_forward(), self.device, scratch_block=self.num_blocks, block_size=self.block_size,
                max_width=-(-self.max_model_len // self.block_size), fixed_width=self.use_triton,
                use_triton=self.use_triton, warmup_stream=self._warmup_stream)
        return self._graphs

    def _graph_forward(self):
        """The decode forward the graphs capture: reads the current caches; compiled once per runner if asked.
        A compiled forward keeps torch ops where the fused kernels would go: inductor fuses those itself, and
        its tracing of our in-place Triton kernels on column views gave wrong tokens (torch 2.11, H100)."""
        spec, fused = self.spec, self.fused_kernels and not self.compile_decode

        def forward(input_ids: Tensor, meta: DecodeMeta, k_caches: list[Tensor], v_caches: list[Tensor]) -> Tensor:
            return forward_hidden(spec, input_ids, meta, k_caches, v_caches, fused=fused)

        if self.compile_decode and self._compiled is None:
            self._compiled = CompiledDecode(forward)
        inner = self._compiled if self.compile_decode else forward
        k_caches, v_caches = self.k_caches, self.v_caches
        return lambda input_ids, meta: inner(input_ids, meta, k_caches, v_caches)

    def _block_tables(self, seqs: Seq[Sequence]) -> Tensor:
        """[S, W] long on the host: the blocks holding each context (blocks reserved beyond it are left out),
        rows padded with the scratch block (a valid id nobody owns)."""
        bs = self.block_size
        return self._pad_tables([seq.block_table[:-(-seq.num_tokens // bs)] for seq in seqs])

    def _pad_tables(self, tables: list[list[int]]) -> Tensor:
        width = max(len(t) for t in tables)
        pad = self.num_blocks
        return torch.tensor([t + [pad] * (width - len(t)) for t in tables], dtype=torch.long)

    def _check(self, seq: Sequence) -> None:
        """Clear errors for what would otherwise be an out-of-bounds write on the device."""
        n, bs = seq.num_tokens, self.block_size
        if n == 0:
            raise ValueError(f"sequence {seq.seq_id} has no tokens")
        if seq.num_pending:
            raise RuntimeError(f"sequence {seq.seq_id} cannot be prefilled with {seq.num_pending} tokens pending")
        if n > self.max_model_len:
            raise ValueError(f"sequence {seq.seq_id} has {n} tokens, more than max_model_len {self.max_model_len}")
        if len(seq.block_table) * bs < n:
            raise ValueError(f"sequence {seq.seq_id} has {n} tokens but {len(seq.block_table)} blocks of {bs}")
        if any(not 0 <= b < self.num_blocks for b in seq.block_table):
            raise ValueError(f"sequence {seq.seq_id} has block ids outside [0, {self.num_blocks}): {seq.block_table}")

    # ------------------------------------------------------------------ sampling

    def _sampler(self, seqs: Seq[Sequence]) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
        """logits [B, vocab] -> (tokens, log-probs) for these sequences; set up once per burst."""
        params = [seq.params for seq in seqs]
        temperature, top_p, top_k = self._sampling_columns(params, self.device)
        filters = any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in params)
        if self.fused_kernels and not filters and fused_sample_available(self.device):
            next_seed = self._seed_source(params)  # one read of the logits instead of a dozen passes
            return lambda logits: fused_sample(logits, temperature, next_seed())
        generator = self._generator(params)
        return lambda logits: sample_tokens(logits, temperature, top_p, top_k, generator, apply_filters=filters)

    def _sampling_columns(self, params: list[SamplingParams], device: torch.device) -> tuple[Tensor, ...]:
        """Per-row temperature, top_p (float32) and top_k (long) on the device: one copy, and none at all while
        the batch's values stay the same (decode steps of the same requests)."""
        key = tuple((p.temperature, p.top_p, p.top_k) for p in params)
        cached = self._sample_cols
        if cached is None or cached[0] != key or cached[1][0].device != device:
            host = copy_to_device(torch.tensor(key, dtype=torch.float64).t(), device)  # float64: any top_k exactly
            cached = self._sample_cols = (key, (host[0].float(), host[1].float(), host[2].long()))
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


def _pick_backend(name: str, device: torch.device) -> bool:
    """Whether decode uses the Triton kernel."""
    if name == "auto":
        return triton_decode_available(device)
    if name == "triton":
        if not triton_decode_available(device):
            raise ValueError(f"attention_backend='triton' needs the triton package and a CUDA device (got {device})")
        return True
    if name == "sdpa":
        return False
    raise ValueError(f"attention_backend must be 'auto', 'triton' or 'sdpa', got {name!r}")


@contextlib.contextmanager
def _eval_mode(modules: list[nn.Module]) -> Iterator[None]:
    """Eval mode (dropout off, e.g. LoRA dropout) for the step; modules that were training get it back after."""
    training = [m for m in modules if m.training]
    for m in training:
        m.training = False
    try:
        yield
    finally:
        for m in training:
            m.training = True
