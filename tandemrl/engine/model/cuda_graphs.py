"""CUDA graphs for decode: one graph per (batch bucket, block-table width), captured on first use, then replayed.

At small models and large batches the kernel launches, not the GPU, set a decode step's pace, so the whole decoder
forward is captured once per shape. A batch is padded to its bucket with rows that write into the scratch block
(owned by no sequence) and attend to one token of it. A graph reads the parameters by address: an in-place update is
seen by the next replay, a replaced tensor (``p.data = ...``) or a toggled peft adapter is not, so the graphs must be
dropped then (``free_kv_cache()``). The engine's sleep parks them instead (slot.py): they serve again after the
wake if the pool and every parameter are back at the addresses they read.

A burst is staged in one host-to-device copy of one pinned buffer laid out as
``[ids | positions | slots | context_lens | groups | table | later steps]``: the head is exactly what the graph of
that (bucket, width) reads, the table column-major (``[width, bucket]`` viewed as ``[bucket, width]``) so the
columns a batch uses are one contiguous prefix and only those move (SDPA graphs read every column: all move);
"later steps" holds ``[positions | slots | context_lens]`` of steps 1..K-1, moved into place by a device copy
before each step. The burst needs no host sync until its end.

The graph ends at the final norm; lm_head and sampling run eagerly after it, so a graph's private output stays small
and the sampler's generator is never captured (a verify round's graph, round_graph.py, captures its greedy
acceptance whole).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.kernels.paged_kv import DecodeMeta
from tandemrl.engine.model.attention import query_groups
from tandemrl.engine.model.decode_plan import DecodePlan
from tandemrl.engine.model.pending import copy_to_device

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# One-step forwards also get a 512 bucket: a tandem burst's (stage_forwards), as a model catching up on the other's
# run reads a few hundred tokens at once (~300 at a burst's end at p = 0.8), and a verify round's (prepare_columns),
# batch x (k + 1) rows.
FORWARD_BUCKETS = BATCH_BUCKETS + (512,)
_COLUMNS = 5  # ids, positions, slots, context_lens, query groups: one [bucket] column each, then the block table

DecodeForward = Callable[[Tensor, DecodeMeta], Tensor]  # (input_ids [B], meta) -> hidden [B, hidden]


@dataclass
class _Staged:
    """A staged one-step plan: its rows, graph bucket and table width, whether its attention groups queries, and
    where its part starts and ends (``head``: the part the graph reads, then the later steps of a burst)."""

    rows: int
    bucket: int
    width: int
    grouped: bool
    offset: int
    head: int


def batch_bucket(batch: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int | None:
    """Smallest bucket holding `batch` rows, or None when the batch is larger than the largest bucket."""
    return next((b for b in buckets if b >= batch), None)


class DecodeGraphs:
    """Captured decode forwards over one static input buffer; see the module docstring."""

    def __init__(self, forward: DecodeForward, device: torch.device, *, scratch_block: int, block_size: int,
                 max_width: int, fixed_width: bool, use_triton: bool, warmup_stream: torch.cuda.Stream | None = None,
                 query_capacity: int = 1) -> None:
        self.forward = forward
        self.warmup_stream = warmup_stream  # the slot's capture stream (one cuBLAS workspace each: runner.py)
        self.device = device
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        self.max_width = max_width
        self.fixed_width = fixed_width  # the Triton kernel reads only context_len tokens: one width suffices
        self.use_triton = use_triton
        self.query_capacity = query_capacity if use_triton else 1  # rows one attention program serves at most
        rows = FORWARD_BUCKETS[-1]
        size = _COLUMNS * rows + rows * max_width
        pinned = device.type == "cuda"
        # Every slot starts as a valid block id / scratch value, so no column a graph may read is ever garbage.
        self.host = torch.empty(size, dtype=torch.long, pin_memory=pinned).fill_(scratch_block)
        self.static = torch.full((size,), scratch_block, dtype=torch.long, device=device)
        self._copied = torch.cuda.Event() if pinned else None  # the host buffer is free once this completes
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None  # shared by captures
        self._burst = _Staged(0, 0, 0, False, 0, 0)
        self._forwards: tuple[Tensor, list[_Staged]] | None = None  # stage_forwards' device buffer and layout
        # whole verify rounds (round_graph.py's RoundGraph, typed there: this module imports nothing of the round
        # code), keyed (bucket, width, k, proposer, rule): they read a proposer's pool and weights too
        self.rounds: dict[tuple, object] = {}

    def width_for(self, blocks: int) -> int:
        """Block-table width of the graph that serves a batch whose longest table has `blocks` entries."""
        if blocks > self.max_width:
            raise ValueError(f"a sequence needs {blocks} blocks, more than max_model_len allows ({self.max_width})")
        return self.max_width if self.fixed_width else min(self.max_width, 1 << max(0, blocks - 1).bit_length())

    def stage(self, plan: DecodePlan) -> None:
        """Copy a burst's inputs to the device (one H2D copy); ``step`` then runs its steps in order."""
        staged = self._layout(plan, 0)
        size = staged.head + 3 * staged.bucket * (plan.num_steps - 1)
        if size > self.host.numel():  # a longer burst than any before: grow both buffers
            self.host = torch.empty(size, dtype=torch.long, pin_memory=self.host.is_pinned())
            self.static = torch.cat((self.static, self.static.new_empty(size - self.static.numel())))
            self.graphs.clear()  # they read the old buffer
        if self._copied is not None:
            self._copied.synchronize()  # the previous burst's copy may still read the buffer
        host = self.host[:size].numpy()
        self._write_head(host, plan, staged)
        later = host[staged.head:size].reshape(plan.num_steps - 1, 3, staged.bucket)
        for c, values in enumerate((plan.positions, plan.slots, plan.context_lens)):
            later[:, c, :staged.rows], later[:, c, staged.rows:] = values[1:], self._pad[c + 1]
        self._burst = staged
        self.static[:size].copy_(self.host[:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def staged_ids(self) -> Tensor:
        """The staged burst's step-0 input ids [B] on the device."""
        return self.static[:self._burst.rows]

    def step(self, j: int, input_ids: Tensor | None) -> Tensor:
        """Step j of the staged burst; ``input_ids`` [B] on the device (None at step 0: the staged ids).
        Returns hidden [B, hidden] (a view of the graph's output, valid until the next replay of that graph)."""
        staged = self._burst
        if j > 0:
            start, bucket = staged.head + 3 * staged.bucket * (j - 1), staged.bucket
            self.static[bucket:4 * bucket].copy_(self.static[start:start + 3 * bucket])
        return self._replay(staged, input_ids)

    def stage_forwards(self, plans: list[DecodePlan]) -> None:
        """Copy the inputs of several one-step plans (a tandem burst's forwards of this model) to the device in one
        copy; ``run_forward(f, ids)`` then runs plan f, in any order. No host sync: the buffer is new each time."""
        layouts, offset = [], 0
        for plan in plans:
            layouts.append(self._layout(plan, offset, buckets=FORWARD_BUCKETS))
            offset += layouts[-1].head
        host = np.empty(offset, dtype=np.int64)
        for plan, staged in zip(plans, layouts):
            self._write_head(host[staged.offset:staged.offset + staged.head], plan, staged)
        self._forwards = (copy_to_device(torch.from_numpy(host), self.device), layouts)

    def run_forward(self, f: int, input_ids: Tensor) -> Tensor:
        """Forward f of ``stage_forwards``' plans over ``input_ids`` [B] on the device: hidden [B, hidden] (a view
        of the graph's output, valid until the next replay of that graph)."""
        packed, layouts = self._forwards
        staged = layouts[f]
        self.static[:staged.head].copy_(packed[staged.offset:staged.offset + staged.head])
        return self._replay(staged, input_ids)

    def prepare_columns(self, table: Tensor, groups: Tensor | None) -> tuple[_Staged, Tensor, Tensor, Tensor]:
        """A one-step forward whose inputs the device computes (verify rounds, round.py): its constant
        part (the block table ``table`` [B, W] and query groups [B] on the device, the padding rows) laid out now in
        a device head; ``run_columns`` fills in each forward's ids, positions, slots and context lengths."""
        rows, w = table.shape
        staged = self._shape(rows, w, groups is not None and self.query_capacity > 1, 0, buckets=FORWARD_BUCKETS)
        bucket = staged.bucket
        head = torch.empty(staged.head, dtype=torch.long, device=self.device)
        columns = head[:_COLUMNS * bucket].view(_COLUMNS, bucket)
        for c, fill in enumerate(self._pad):
            columns[c, rows:] = fill
        columns[4, :rows] = groups if staged.grouped else 1
        head[_COLUMNS * bucket:].view(-1, bucket).fill_(self.scratch_block)[:w, :rows] = table.t()
        return staged, head, columns[0, :rows], columns[1:4, :rows]  # the last two: where each forward's inputs go

    def run_columns(self, prepared: tuple[_Staged, Tensor, Tensor, Tensor], input_ids: Tensor,
                    columns: Tensor) -> Tensor:
        """The forward ``prepare_columns`` laid out, over ``input_ids`` [B] and ``columns`` [3, B] (positions, slots,
        context lengths), all on the device: device copies and one replay. Hidden [B, hidden], as ``step``."""
        staged, head, ids_part, columns_part = prepared
        ids_part.copy_(input_ids)
        columns_part.copy_(columns)
        self.static[:staged.head].copy_(head)
        return self._replay(staged, None)

    def _replay(self, staged: _Staged, input_ids: Tensor | None) -> Tensor:
        if input_ids is not None:
            self.static[:staged.rows].copy_(input_ids)
        key = (staged.bucket, staged.width, staged.grouped)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:staged.rows]

    def _layout(self, plan: DecodePlan, offset: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> _Staged:
        """Where a plan's step-0 inputs go: its rows, graph bucket and width, and the size of that part."""
        grouped = plan.row_of is not None and self.query_capacity > 1
        return self._shape(len(plan.ids), plan.tables.shape[1], grouped, offset, buckets)

    def _shape(self, rows: int, w: int, grouped: bool, offset: int,
               buckets: tuple[int, ...] = BATCH_BUCKETS) -> _Staged:
        bucket = batch_bucket(rows, buckets)
        if bucket is None:
            raise ValueError(f"batch {rows} is larger than the largest CUDA graph bucket {buckets[-1]}")
        # SDPA gathers every column of its width: copy them all
        cols = self.width_for(w) if not self.fixed_width else w
        return _Staged(rows, bucket, self.width_for(w), grouped, offset, (_COLUMNS + cols) * bucket)

    @property
    def _pad(self) -> tuple[int, int, int, int, int]:
        """Padding rows: token 0 at position 0, one token of the scratch block, a query group of their own."""
        return 0, 0, self.scratch_slot, 1, 1

    def _write_head(self, host: np.ndarray, plan: DecodePlan, staged: _Staged) -> None:
        """Step 0's columns and the block table of ``plan`` into ``host`` [head], laid out as its graph reads them."""
        B, bucket = staged.rows, staged.bucket
        groups = query_groups(plan.row_of, self.query_capacity) if staged.grouped else 1
        columns = host[:_COLUMNS * bucket].reshape(_COLUMNS, bucket)
        for c, (values, fill) in enumerate(zip((plan.ids, plan.positions[0], plan.slots[0], plan.context_lens[0],
                                                groups), self._pad)):
            columns[c, :B], columns[c, B:] = values, fill
        w = plan.tables.shape[1]
        table = host[_COLUMNS * bucket:staged.head].reshape(-1, bucket)
        table.fill(self.scratch_block)
        table[:w, :B] = plan.tables.T

    def static_inputs(self, bucket: int, width: int, grouped: bool = False) -> tuple[Tensor, DecodeMeta]:
        """The views of the static buffer a graph of (`bucket` rows, `width` table columns) reads."""
        buf = self.static
        table = buf[_COLUMNS * bucket:(_COLUMNS + width) * bucket].view(width, bucket).t()
        meta = DecodeMeta(positions=buf[bucket:2 * bucket], slot_mapping=buf[2 * bucket:3 * bucket],
                          block_tables=table, context_lens=buf[3 * bucket:4 * bucket], use_triton=self.use_triton,
                          query_groups=buf[4 * bucket:5 * bucket] if grouped else None)
        return buf[:bucket], meta

    def _capture(self, bucket: int, width: int, grouped: bool) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        ids, meta = self.static_inputs(bucket, width, grouped)
        return self.capture(lambda: self.forward(ids, meta))

    def capture(self, body: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
        """``body`` (device work over static tensors) captured in this model's graph pool, after one warm-up run
        outside the capture (Triton compiles, cuBLAS picks its workspace). The warm-up runs the real step: the K/V it
        writes are the values the replays write again."""
        if self.warmup_stream is None:
            self.warmup_stream = torch.cuda.Stream(self.device)
        side = self.warmup_stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (telemetry, data loading) must not abort our capture. The side
        # stream, not torch's default capture stream: that one lives on whichever device first captured, and a
        # runner's slots may sit on different GPUs (placement.py). capture_begin/end, not torch.cuda.graph: that one
        # also empties PyTorch's device cache, which the trainer's next update then refills from the device.
        # Python's garbage collector is off meanwhile: a collected cycle holding an old CUDA graph (a closed
        # engine's) destroys it, which is not permitted while a stream captures and invalidates the capture.
        torch.cuda.synchronize(self.device)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    out = body()
                finally:
                    graph.capture_end()
        finally:
            if collecting:
                gc.enable()
        return graph, out
