"""One model the runner hosts (the target policy, a draft, a frozen partner): its modules, its KV pool, its graphs.

Every slot's pool has the same number of blocks, indexed by the block manager's block ids, so one block table
addresses a sequence's K/V in every slot; each slot's pool is shaped by its own model (layers, KV heads, head
size, dtype). The pool holds one extra block past ``num_blocks`` (the scratch block): CUDA-graph padding rows and
the dead steps of a burst write there. Forwards read the model's parameter tensors in place (zero copy).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from tandemrl.engine.kernels.attention_tiles import decode_query_capacity
from tandemrl.engine.kernels.paged_kv import DecodeMeta, PrefillMeta
from tandemrl.engine.model.attention import query_groups
from tandemrl.engine.model.cuda_graphs import FORWARD_BUCKETS, DecodeGraphs, batch_bucket
from tandemrl.engine.model.decode_plan import DecodePlan
from tandemrl.engine.model.forward import DecoderSpec, forward_hidden, inspect_decoder
from tandemrl.engine.model.pending import copy_to_device
from tandemrl.engine.model.placement import on_device

StepFn = Callable[[int, "Tensor | None"], Tensor]  # (step j, its input ids or None for the staged ones) -> hidden


@dataclass
class SlotStats:
    """What a slot counts, for the benches to read (nothing on the engine's path reads it)."""

    forwards: int = 0  # batched forward passes run (bench/tandem_step.py reports them per token)


@dataclass
class _Parked:
    """Graphs kept over a sleep, and the addresses they read (``ModelSlot._captured_addresses``)."""

    graphs: DecodeGraphs
    addresses: tuple  # (num_blocks, pool address, parameter and buffer addresses, adapter state)


class ModelSlot:
    """A model's forward over its own paged KV pool; see the module docstring."""

    def __init__(self, name: str, model: nn.Module, device: torch.device, block_size: int, max_model_len: int | None,
                 *, use_triton: bool, fused_kernels: bool, enforce_eager: bool, warmup_stream: torch.cuda.Stream | None,
                 home: torch.device | None = None, kv_cache_dtype: str = "auto") -> None:
        self.name = name
        self.model = model
        self.spec: DecoderSpec = inspect_decoder(model)
        # engine.kv_cache_dtype: "fp8_e4m3" stores K/V as float8 (the stores saturate, attention dequantises)
        self.kv_dtype = torch.float8_e4m3fn if kv_cache_dtype == "fp8_e4m3" else self.spec.dtype
        self.device = device
        self.block_size = block_size
        self.max_model_len = int(max_model_len or self.spec.max_position_embeddings or 4096)
        self.use_triton = use_triton
        self.fused_kernels = fused_kernels
        self.enforce_eager = enforce_eager
        self.warmup_stream = warmup_stream  # where it captures (runner.py); tandem's frozen slot also replays there
        self.home = home or device  # the runner's device; a slot elsewhere launches its work on its own (placement.py)
        self.modules = list(model.modules())
        self._params = list(model.parameters())
        self._adapter_layers = [m for m in self.modules if hasattr(m, "disable_adapters") and hasattr(m, "merged")]
        self._graphs_adapter_state: Hashable = self._adapter_state()
        self.num_blocks = 0
        self.k_caches: list[Tensor] = []
        self.v_caches: list[Tensor] = []
        self.graphs: DecodeGraphs | None = None
        self._parked: _Parked | None = None  # graphs kept over a sleep
        self.stats = SlotStats()

    # ------------------------------------------------------------------ weights

    def weights_version(self) -> Hashable:
        """Changes when the weights this slot computes with change: an in-place write to a parameter that bumps its
        version counter (``load_state_dict``, foreach/for-loop optimizers; NOT the fused optimizers, nor writes
        through ``.data``: the engine also keys cached blocks by the rollout's policy version) or a peft adapter
        switched, merged or unmerged. An adapter change also drops the CUDA graphs, which captured the adapters'
        control flow."""
        adapters = self._adapter_state()
        if adapters != self._graphs_adapter_state:
            self.graphs = None
            self._graphs_adapter_state = adapters
        return sum(p._version for p in self._params), adapters

    def _adapter_state(self) -> Hashable:
        return tuple((bool(m.disable_adapters), tuple(getattr(m, "active_adapters", ())), bool(m.merged))
                     for m in self._adapter_layers)

    # ------------------------------------------------------------------ KV pool

    def bytes_per_block(self, block_size: int | None = None) -> int:
        """K and V of every layer for one block."""
        s = self.spec
        return 2 * s.num_layers * (block_size or self.block_size) * s.num_kv_heads * s.head_dim * self.kv_dtype.itemsize

    def allocate(self, num_blocks: int) -> None:
        """Allocate (zeroed, so masked-out slots are finite) K/V for ``num_blocks`` blocks plus the scratch block;
        the graphs parked by ``free(keep_graphs=True)`` come back if every address they captured is the same."""
        parked = self._parked
        self.free()
        s = self.spec
        shape = (2, s.num_layers, num_blocks + 1, self.block_size, s.num_kv_heads, s.head_dim)
        kv = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.k_caches = list(kv[0].unbind(0))
        self.v_caches = list(kv[1].unbind(0))
        self.num_blocks = num_blocks
        if parked is not None and parked.addresses == self._captured_addresses():
            self.graphs = parked.graphs

    def free(self, keep_graphs: bool = False) -> None:
        """Drop the pool and the graphs. ``keep_graphs`` (a sleep between rollouts): park the graphs with the
        addresses they read (pool, parameters, buffers) instead: the trainer's update usually frees what it
        allocated in the pool's memory, the next ``allocate`` then gets the same address and skips the captures."""
        keep = keep_graphs and self.graphs is not None and bool(self.k_caches)
        self._parked = _Parked(self.graphs, self._captured_addresses()) if keep else None
        self.graphs = None
        self.k_caches, self.v_caches = [], []
        self.num_blocks = 0

    @property
    def parked_pool_address(self) -> int:
        """Where the pool of the parked graphs was (0: none parked): the runner allocates the pools in this order,
        as PyTorch's allocator hands out the lowest-addressed of equally sized free blocks."""
        return self._parked.addresses[1] if self._parked is not None else 0

    def _captured_addresses(self) -> tuple:
        """What a captured graph reads by address: the pool, every parameter and buffer (a tensor replaced by the
        trainer, or a peft adapter toggled, must not be read through a stale address)."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return (self.num_blocks, self.k_caches[0].data_ptr(), tuple(t.data_ptr() for t in tensors),
                self._adapter_state())

    # ------------------------------------------------------------------ forwards

    def logits(self, hidden: Tensor) -> Tensor:
        """[S, hidden] final-norm states -> [S, vocab] logits, through the model's own lm_head."""
        return self.spec.lm_head(hidden)

    def forward(self, input_ids: Tensor, meta: PrefillMeta, rows: Tensor | None) -> Tensor:
        """Packed tokens through the decoder, their K/V written; the final hidden states of ``rows`` (all: None)."""
        self.stats.forwards += 1
        with self.on_device():
            return self._forward(input_ids, meta, rows)

    def _forward(self, input_ids: Tensor, meta: PrefillMeta | DecodeMeta, rows: Tensor | None = None) -> Tensor:
        """The decoder over this slot's pool (read at each call: parked graphs must not keep a freed pool alive)."""
        return forward_hidden(self.spec, input_ids, meta, self.k_caches, self.v_caches, rows=rows,
                              fused=self.fused_kernels)

    def _query_groups(self, row_of: np.ndarray | None) -> Tensor | None:
        """The attention's query groups of rows of one sequence side by side (``DecodePlan.row_of``), on the device."""
        if row_of is None or not self.use_triton or self.query_capacity <= 1:
            return None
        return copy_to_device(torch.from_numpy(query_groups(row_of, self.query_capacity)), self.device)

    def on_device(self):
        """This slot's device as the current CUDA device, when it is not the runner's (placement.py)."""
        return on_device(self.device, self.home)

    def decode_steps(self, plan: DecodePlan) -> tuple[StepFn, Tensor]:
        """(step j's forward, the staged step-0 input ids on the device) for a decode burst."""
        with self.on_device():
            if not self.enforce_eager and batch_bucket(len(plan.ids)) is not None:
                graphs = self.decode_graphs()
                graphs.stage(plan)
                step, staged = graphs.step, graphs.staged_ids()
            else:
                step, staged = self._eager_steps(plan)

        def counted(j: int, input_ids: Tensor | None) -> Tensor:
            self.stats.forwards += 1
            with self.on_device():
                return step(j, input_ids)

        return counted, staged

    def decode_forwards(self, plans: list[DecodePlan]) -> Callable[[int, Tensor], Tensor]:
        """(f, input ids [B_f] on the device) -> hidden of one-step plan f: every plan staged now, in one copy
        (CUDA graphs), so the forwards run with no host work but a device copy and a replay each."""
        graphed = [not self.enforce_eager and batch_bucket(len(p.ids), FORWARD_BUCKETS) is not None for p in plans]
        nth_staged = np.cumsum(graphed) - 1  # a plan's index among the staged ones
        if any(graphed):
            with self.on_device():
                graphs = self.decode_graphs()
                graphs.stage_forwards([p for p, g in zip(plans, graphed) if g])

        def counted(f: int, input_ids: Tensor) -> Tensor:
            self.stats.forwards += 1
            with self.on_device():
                if graphed[f]:
                    return graphs.run_forward(int(nth_staged[f]), input_ids)
                return self._eager_steps(plans[f])[0](0, input_ids)  # more rows than the largest graph bucket

        return counted

    def column_forward(self, table: Tensor, row_of: np.ndarray | None = None, eager: bool = False
                       ) -> Callable[[Tensor, Tensor], Tensor]:
        """(input ids [B], columns [3, B]: positions, KV slots, context lengths) -> hidden [B, hidden], all on this
        slot's device: one-step forwards whose inputs the device computes (verify rounds, round.py) over ``table``
        [B, W]; ``row_of``: as ``DecodePlan.row_of``. CUDA graphs serve them unless ``eager`` (a round graph
        captures the eager forward) or B is past the largest bucket."""
        groups = self._query_groups(row_of)
        graphed = not (eager or self.enforce_eager) and batch_bucket(len(table), FORWARD_BUCKETS) is not None
        with self.on_device():
            if graphed:
                graphs = self.decode_graphs()
                prepared = graphs.prepare_columns(table, groups)

        def run(input_ids: Tensor, columns: Tensor) -> Tensor:
            self.stats.forwards += 1
            with self.on_device():
                if graphed:
                    return graphs.run_columns(prepared, input_ids, columns)
                positions, slots, context_lens = columns.unbind(0)
                return self._forward(input_ids, DecodeMeta(positions=positions, slot_mapping=slots, block_tables=table,
                                                           context_lens=context_lens, use_triton=self.use_triton,
                                                           query_groups=groups))

        return run

    def _eager_steps(self, plan: DecodePlan) -> tuple[StepFn, Tensor]:
        """Without graphs: the burst's columns go to the device at once."""
        columns = copy_to_device(torch.from_numpy(np.stack((plan.positions, plan.slots, plan.context_lens))),
                                 self.device)
        tables = copy_to_device(torch.from_numpy(plan.tables), self.device)
        first_ids = copy_to_device(torch.from_numpy(plan.ids), self.device)
        groups = self._query_groups(plan.row_of)

        def run_step(j: int, input_ids: Tensor | None) -> Tensor:
            positions, slots, context_lens = columns[:, j].unbind(0)
            meta = DecodeMeta(positions=positions, slot_mapping=slots, block_tables=tables, context_lens=context_lens,
                              use_triton=self.use_triton, query_groups=groups if j == 0 else None)
            return self._forward(first_ids if input_ids is None else input_ids, meta)

        return run_step, first_ids

    def decode_graphs(self) -> DecodeGraphs:
        if self.graphs is None:
            self.graphs = DecodeGraphs(
                self._forward, self.device, scratch_block=self.num_blocks, block_size=self.block_size,
                max_width=-(-self.max_model_len // self.block_size), fixed_width=self.use_triton,
                use_triton=self.use_triton, warmup_stream=self.warmup_stream, query_capacity=self.query_capacity)
        return self.graphs

    @property
    def query_capacity(self) -> int:
        """Rows of one sequence the Triton decode attention serves in one program (see ``query_groups``)."""
        return decode_query_capacity(self.spec.num_heads, self.spec.num_kv_heads)


@contextlib.contextmanager
def eval_mode(modules: list[nn.Module]) -> Iterator[None]:
    """Eval mode (dropout off, e.g. LoRA dropout) for a step; modules that were training get it back after."""
    training = [m for m in modules if m.training]
    for m in training:
        m.training = False
    try:
        yield
    finally:
        for m in training:
            m.training = True
