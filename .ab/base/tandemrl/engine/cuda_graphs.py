"""CUDA graphs for decode: one graph per (batch bucket, block-table width), captured on first use, then replayed.

A decode step launches a few kernels per layer; at small models and large batches the launch overhead, not the
GPU, sets the pace, so we capture the whole decoder forward once per shape and replay it. Inputs live in static
buffers the graph reads; a batch is padded up to its bucket with rows that write into the runner's scratch block
(owned by no sequence) and attend to one token of it. The graph reads the model's parameter tensors by address:
an in-place optimizer update is seen by the next replay; replacing a parameter tensor (``p.data = ...``) is not,
so call ``free_kv_cache()`` on the runner (which drops the graphs) after doing that. For the same reason, toggling
peft adapters (merge, disable) needs the graphs dropped too.

Staging is one host-to-device copy per decode burst (see decode_plan.py): the host writes the burst's inputs
into one pinned buffer laid out as ``[ids | positions | slots | context_lens | table | later steps]``: the first
part is exactly what the graph of that (bucket, width) reads from the matching device buffer, with the table
column-major (``[width, bucket]`` viewed as ``[bucket, width]``, so the columns a batch uses form one contiguous
prefix and the copy moves only those; the Triton kernel never reads past a row's context, SDPA graphs copy every
column); "later steps" holds ``[positions | slots | context_lens]`` of steps 1..K-1. Before step j > 0 one device
copy moves step j's columns into place and one copies the tokens sampled at step j - 1 into ``ids``: the burst
needs no host sync until its end.

The forward may be a ``torch.compile``d callable (see compile.py): its warm-up run compiles, then we capture.

The graph ends at the final norm (hidden states [bucket, hidden]); lm_head and sampling run eagerly after it, so a
graph's private output stays small and the sampler's generator is never captured.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from tandemrl.engine.attention import DecodeMeta
from tandemrl.engine.decode_plan import DecodePlan

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

DecodeForward = Callable[[Tensor, DecodeMeta], Tensor]  # (input_ids [B], meta) -> hidden [B, hidden]


def batch_bucket(batch: int) -> int | None:
    """Smallest bucket holding `batch` rows, or None when the batch is larger than the largest bucket."""
    return next((b for b in BATCH_BUCKETS if b >= batch), None)


class DecodeGraphs:
    """Captured decode forwards over one static input buffer; see the module docstring."""

    def __init__(
        self, forward: DecodeForward, device: torch.device, *, scratch_block: int, block_size: int,
        max_width: int, fixed_width: bool, use_triton: bool, warmup_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.forward = forward
        # Warm-ups run on a side stream; a runner passes the same one to each of its DecodeGraphs: cuBLAS keeps a
        # workspace (32 MiB on Hopper) for every stream it has run on, for the life of the process.
        self.warmup_stream = warmup_stream
        self.device = device
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        self.max_width = max_width
        self.fixed_width = fixed_width  # the Triton kernel reads only context_len tokens: one width suffices
        self.use_triton = use_triton
        rows = BATCH_BUCKETS[-1]
        size = 4 * rows + rows * max_width
        pinned = device.type == "cuda"
        # Every slot starts as a valid block id / scratch value, so no column a graph may read is ever garbage.
        self.host = torch.empty(size, dtype=torch.long, pin_memory=pinned).fill_(scratch_block)
        self.static = torch.full((size,), scratch_block, dtype=torch.long, device=device)
        self._copied = torch.cuda.Event() if pinned else None  # the host buffer is free once this completes
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None  # shared by captures
        self._burst: tuple[int, int, int, int] = (0, 0, 0, 0)  # (rows, bucket, width, later-steps offset)

    def width_for(self, blocks: int) -> int:
        """Block-table width of the graph that serves a batch whose longest table has `blocks` entries."""
        if blocks > self.max_width:
            raise ValueError(f"a sequence needs {blocks} blocks, more than max_model_len allows ({self.max_width})")
        if self.fixed_width:
            return self.max_width
        return min(self.max_width, 1 << max(0, blocks - 1).bit_length())

    def stage(self, plan: DecodePlan) -> None:
        """Copy a burst's inputs to the device (one H2D copy); ``step`` then runs its steps in order."""
        B, K = len(plan.ids), plan.num_steps
        bucket = batch_bucket(B)
        if bucket is None:
            raise ValueError(f"batch {B} is larger than the largest CUDA graph bucket {BATCH_BUCKETS[-1]}")
        w = plan.tables.shape[1]
        width = self.width_for(w)
        cols = w if self.fixed_width else width  # SDPA gathers every column of its width: copy them all
        head = 4 * bucket + cols * bucket
        size = head + 3 * bucket * (K - 1)
        if size > self.host.numel():  # a longer burst than any before: grow both buffers
            self.host = torch.empty(size, dtype=torch.long, pin_memory=self.host.is_pinned())
            self.static = torch.cat((self.static, self.static.new_empty(size - self.static.numel())))
            self.graphs.clear()  # they read the old buffer
        if self._copied is not None:
            self._copied.synchronize()  # the previous burst's copy may still read the buffer
        host = self.host[:size].numpy()
        pad = (0, 0, self.scratch_slot, 1)  # padding rows: token 0 at position 0, one token of the scratch block
        columns = host[:4 * bucket].reshape(4, bucket)
        for c, (values, fill) in enumerate(zip((plan.ids, plan.positions[0], plan.slots[0], plan.context_lens[0]),
                                               pad)):
            columns[c, :B], columns[c, B:] = values, fill
        table = host[4 * bucket:head].reshape(cols, bucket)
        table.fill(self.scratch_block)
        table[:w, :B] = plan.tables.T
        later = host[head:].reshape(K - 1, 3, bucket)
        for c, values in enumerate((plan.positions, plan.slots, plan.context_lens)):
            later[:, c, :B], later[:, c, B:] = values[1:], pad[c + 1]
        self.static[:size].copy_(self.host[:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self._burst = (B, bucket, width, head)

    def staged_ids(self) -> Tensor:
        """The staged burst's step-0 input ids [B] on the device."""
        return self.static[:self._burst[0]]

    def step(self, j: int, input_ids: Tensor | None) -> Tensor:
        """Step j of the staged burst; ``input_ids`` [B] on the device (None at step 0: the staged ids).
        Returns hidden [B, hidden] (a view of the graph's output, valid until the next replay of that graph)."""
        B, bucket, width, head = self._burst
        if j > 0:
            start = head + 3 * bucket * (j - 1)
            self.static[bucket:4 * bucket].copy_(self.static[start:start + 3 * bucket])
        if input_ids is not None:
            self.static[:B].copy_(input_ids)
        key = (bucket, width)
        if key not in self.graphs:
            self.graphs[key] = self._capture(bucket, width)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:B]

    def static_inputs(self, bucket: int, width: int) -> tuple[Tensor, DecodeMeta]:
        """The views of the static buffer a graph of (`bucket` rows, `width` table columns) reads."""
        buf = self.static
        table = buf[4 * bucket:4 * bucket + width * bucket].view(width, bucket).t()
        meta = DecodeMeta(positions=buf[bucket:2 * bucket], slot_mapping=buf[2 * bucket:3 * bucket],
                          block_tables=table, context_lens=buf[3 * bucket:4 * bucket], use_triton=self.use_triton)
        return buf[:bucket], meta

    def _capture(self, bucket: int, width: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        ids, meta = self.static_inputs(bucket, width)
        # Warm up outside the capture (Triton and torch.compile compile, cuBLAS picks its workspace). It runs the
        # real step: the K/V it writes are the same values the replay below writes again.
        if self.warmup_stream is None:
            self.warmup_stream = torch.cuda.Stream(self.device)
        side = self.warmup_stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.forward(ids, meta)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (telemetry, data loading) must not abort our capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self.forward(ids, meta)
        return graph, out
