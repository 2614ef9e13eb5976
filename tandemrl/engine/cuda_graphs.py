"""CUDA graphs for decode: one graph per (batch bucket, block-table width), captured on first use, then replayed.

A decode step launches a few kernels per layer; at small models and large batches the launch overhead, not the
GPU, sets the pace, so we capture the whole decoder forward once per shape and replay it. Inputs live in static
buffers the graph reads; a batch is padded up to its bucket with rows that write into the runner's scratch block
(owned by no sequence) and attend to one token of it. The graph reads the model's parameter tensors by address:
an in-place optimizer update is seen by the next replay; replacing a parameter tensor (``p.data = ...``) is not,
so call ``free_kv_cache()`` on the runner (which drops the graphs) after doing that. For the same reason, toggling
peft adapters (merge, disable) needs the graphs dropped too.

The graph ends at the final norm (hidden states [bucket, hidden]); lm_head and sampling run eagerly after it, so a
graph's private output stays small and the sampler's generator is never captured.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from tandemrl.engine.attention import DecodeMeta

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

DecodeForward = Callable[[Tensor, DecodeMeta], Tensor]  # (input_ids [B], meta) -> hidden [B, hidden]


def batch_bucket(batch: int) -> int | None:
    """Smallest bucket holding `batch` rows, or None when the batch is larger than the largest bucket."""
    return next((b for b in BATCH_BUCKETS if b >= batch), None)


class DecodeGraphs:
    """Captured decode forwards over static input buffers; see the module docstring."""

    def __init__(
        self, forward: DecodeForward, device: torch.device, *, scratch_block: int, block_size: int,
        max_width: int, fixed_width: bool, use_triton: bool,
    ) -> None:
        self.forward = forward
        self.device = device
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        self.max_width = max_width
        self.fixed_width = fixed_width  # the Triton kernel reads only context_len tokens: one width suffices
        self.use_triton = use_triton
        rows = BATCH_BUCKETS[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.zeros(rows, dtype=torch.long, device=device)
        self.context_lens = torch.ones(rows, dtype=torch.long, device=device)
        self.tables: dict[int, Tensor] = {}  # width -> [rows, width] block ids
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None  # shared by captures

    def width_for(self, blocks: int) -> int:
        """Block-table width of the graph that serves a batch whose longest table has `blocks` entries."""
        if blocks > self.max_width:
            raise ValueError(f"a sequence needs {blocks} blocks, more than max_model_len allows ({self.max_width})")
        if self.fixed_width:
            return self.max_width
        return min(self.max_width, 1 << max(0, blocks - 1).bit_length())

    def run(self, input_ids: Tensor, positions: Tensor, slots: Tensor, context_lens: Tensor,
            block_tables: Tensor) -> Tensor:
        """Inputs for B <= 256 rows (any device); block_tables [B, w]. Returns hidden [B, hidden] (a view of
        the graph's output, valid until the next replay of that graph)."""
        B, w = block_tables.shape
        bucket = batch_bucket(B)
        if bucket is None:
            raise ValueError(f"batch {B} is larger than the largest CUDA graph bucket {BATCH_BUCKETS[-1]}")
        width = self.width_for(w)
        table = self._table(width)
        self._stage(self.input_ids, input_ids, bucket, 0)
        self._stage(self.positions, positions, bucket, 0)
        self._stage(self.slots, slots, bucket, self.scratch_slot)
        self._stage(self.context_lens, context_lens, bucket, 1)
        table[:B, :w].copy_(block_tables, non_blocking=True)
        table[:B, w:width].fill_(self.scratch_block)
        table[B:bucket].fill_(self.scratch_block)
        key = (bucket, width)
        if key not in self.graphs:
            self.graphs[key] = self._capture(bucket, table)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:B]

    @staticmethod
    def _stage(buffer: Tensor, values: Tensor, bucket: int, pad: int) -> None:
        B = values.shape[0]
        buffer[:B].copy_(values, non_blocking=True)
        buffer[B:bucket].fill_(pad)

    def _table(self, width: int) -> Tensor:
        if width not in self.tables:
            self.tables[width] = torch.full((BATCH_BUCKETS[-1], width), self.scratch_block, dtype=torch.long,
                                            device=self.device)
        return self.tables[width]

    def static_inputs(self, bucket: int, table: Tensor) -> tuple[Tensor, DecodeMeta]:
        """The views of the static buffers a graph of `bucket` rows reads."""
        meta = DecodeMeta(positions=self.positions[:bucket], slot_mapping=self.slots[:bucket],
                          block_tables=table[:bucket], context_lens=self.context_lens[:bucket],
                          use_triton=self.use_triton)
        return self.input_ids[:bucket], meta

    def _capture(self, bucket: int, table: Tensor) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        ids, meta = self.static_inputs(bucket, table)
        # Warm up outside the capture (Triton compiles, cuBLAS picks its workspace). It runs the real step:
        # the K/V it writes are the same values the replay below writes again.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.forward(ids, meta)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (telemetry, data loading) must not abort our capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self.forward(ids, meta)
        return graph, out
