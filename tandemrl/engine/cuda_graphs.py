"""CUDA graphs for decode: one graph per (batch bucket, block-table width), captured on first use, then replayed.

A decode step launches a few kernels per layer; at small models and large batches the launch overhead, not the
GPU, sets the pace, so we capture the whole decoder forward once per shape and replay it. Inputs live in static
buffers the graph reads; a batch is padded up to its bucket with rows that write into the runner's scratch block
(owned by no sequence) and attend to one token of it. The graph reads the model's parameter tensors by address:
an in-place optimizer update is seen by the next replay; replacing a parameter tensor (``p.data = ...``) is not,
so call ``free_kv_cache()`` on the runner (which drops the graphs) after doing that. For the same reason, toggling
peft adapters (merge, disable) needs the graphs dropped too.

Staging is one host-to-device copy per step: the host writes every input of the step (ids, positions, slots,
context lengths, block table) into one pinned buffer, laid out as the graph of that (bucket, width) reads them from
the matching device buffer: ``[ids | positions | slots | context_lens | table]`` with the table column-major
(``[width, bucket]`` viewed as ``[bucket, width]``), so the columns a batch uses form one contiguous prefix and
the copy moves only those (the Triton kernel never reads past a row's context; SDPA graphs copy every column).

The forward may be a ``torch.compile``d callable (see compile.py): its warm-up run compiles, then we capture.

The graph ends at the final norm (hidden states [bucket, hidden]); lm_head and sampling run eagerly after it, so a
graph's private output stays small and the sampler's generator is never captured.
"""

from __future__ import annotations

import array
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
    """Captured decode forwards over one static input buffer; see the module docstring."""

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
        size = 4 * rows + rows * max_width
        pinned = device.type == "cuda"
        # Every slot starts as a valid block id / scratch value, so no column a graph may read is ever garbage.
        self.host = torch.empty(size, dtype=torch.long, pin_memory=pinned).fill_(scratch_block)
        self.static = torch.full((size,), scratch_block, dtype=torch.long, device=device)
        self._copied = torch.cuda.Event() if pinned else None  # the host buffer is free once this completes
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None  # shared by captures

    def width_for(self, blocks: int) -> int:
        """Block-table width of the graph that serves a batch whose longest table has `blocks` entries."""
        if blocks > self.max_width:
            raise ValueError(f"a sequence needs {blocks} blocks, more than max_model_len allows ({self.max_width})")
        if self.fixed_width:
            return self.max_width
        return min(self.max_width, 1 << max(0, blocks - 1).bit_length())

    def run(self, input_ids: list[int], positions: list[int], slots: list[int], context_lens: list[int],
            block_tables: list[list[int]]) -> Tensor:
        """Host-side inputs for B <= 256 rows; block_tables[i] lists the blocks holding row i's context.
        Returns hidden [B, hidden] (a view of the graph's output, valid until the next replay of that graph)."""
        B = len(input_ids)
        bucket = batch_bucket(B)
        if bucket is None:
            raise ValueError(f"batch {B} is larger than the largest CUDA graph bucket {BATCH_BUCKETS[-1]}")
        w = max(len(t) for t in block_tables)
        width = self.width_for(w)
        cols = w if self.fixed_width else width  # SDPA gathers every column of its width: copy them all
        n = self._fill_host(bucket, cols, (input_ids, positions, slots, context_lens), block_tables)
        self.static[:n].copy_(self.host[:n], non_blocking=True)  # the step's one H2D copy
        if self._copied is not None:
            self._copied.record()
        key = (bucket, width)
        if key not in self.graphs:
            self.graphs[key] = self._capture(bucket, width)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:B]

    def _fill_host(self, bucket: int, cols: int, columns: tuple[list[int], ...], tables: list[list[int]]) -> int:
        """Write a step's inputs into the host buffer in the (bucket, width) layout; returns the elements used."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy may still read the buffer
        B, pad = len(tables), bucket - len(tables)
        ids, positions, slots, context_lens = columns
        scratch = self.scratch_block
        flat = ids + [0] * pad + positions + [0] * pad + slots + [self.scratch_slot] * pad + context_lens + [1] * pad
        rows = [t + [scratch] * (cols - len(t)) for t in tables]  # short rows padded with the scratch block
        tail = [scratch] * pad  # padding rows attend to one token of the scratch block
        for column in zip(*rows):  # the table column-major, as the graphs' views read it
            flat += column
            flat += tail
        n = len(flat)
        # array -> frombuffer converts the ints in C, several times faster than torch.tensor(list)
        self.host[:n].copy_(torch.frombuffer(array.array("q", flat), dtype=torch.long))
        return n

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
