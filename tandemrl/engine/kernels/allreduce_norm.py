"""One launch for a row-parallel layer's all-reduce, the residual add and the next RMSNorm (tensor-parallel decode).

Each rank of a tensor-parallel group writes its partial product [rows, hidden] (o_proj's or down_proj's local GEMM)
into its own buffer of PyTorch symmetric memory, which every peer can read over NVLink. One Triton kernel then, on
every rank: waits until every peer's partial is written (a barrier over the signal pads), sums the N partials row by
row **in rank order 0..N-1 in float32** and rounds the sum to the activation dtype (so every rank holds the same bits,
as an all-reduce hands every rank the same sum: the ranks' samplers rely on identical logits), then computes
``fused.add_rmsnorm``'s residual add and RMSNorm with the same code (the same bits as that kernel given the same sum),
and at the end waits at a second barrier until every peer has read this rank's buffer (the next GEMM overwrites it).
That replaces an NCCL all-reduce and the add_rmsnorm kernel (two launches and a ring) by one launch.

The barrier is the self-resetting signal-pad scheme of PyTorch's symmetric-memory kernels: program p of rank r sets
slot (p, r) of every peer's pad from 0 to 1 (release, system scope; spinning while the peer has not yet consumed the
previous signal) and takes each slot (p, peer) of its own pad from 1 back to 0 (acquire). Every barrier leaves the
pads as it found them, and the pointers never change, so the launch can be captured in a CUDA graph and replayed any
number of times; no host synchronisation. Every rank launches the same number of programs (same rows), so slot p
always pairs program p of every rank.

Rows up to ``max_rows`` (decode batches); larger inputs keep the NCCL all-reduce (the caller decides: ``fits``).
``allreduce_add_rmsnorm_ref`` is the pure-torch reference; ``allreduce_add_rmsnorm`` also takes plain tensors as the
"peer" partials with the barrier off (one process: Triton's interpreter in the CPU tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandemrl.engine.kernels.fused import _warps, add_rmsnorm_ref, fused_available

try:  # optional: without Triton the NCCL path stays
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install
    triton = None

WORLD_SIZES = (2, 4, 8)
MAX_ROWS = 256  # the engine's default max_num_seqs: its decode batches; larger inputs (prefill) keep NCCL
MAX_PROGRAMS = 64  # programs per launch at most: each row loop is short, and the signal pads stay small


def allreduce_add_rmsnorm_ref(partials: list[Tensor], residual: Tensor | None, weight: Tensor, eps: float
                              ) -> tuple[Tensor, Tensor]:
    """(RMSNorm(residual + sum), residual + sum) with sum = the partials added in list (rank) order in float32, then
    rounded to their dtype, as an all-reduce's result; the rest exactly as ``fused.add_rmsnorm_ref``."""
    total = partials[0].float()
    for p in partials[1:]:
        total = total + p.float()
    return add_rmsnorm_ref(total.to(partials[0].dtype), residual, weight, eps)


def allreduce_add_rmsnorm(peer_ptrs: Tensor, rows: int, hidden: int, dtype: torch.dtype, residual: Tensor | None,
                          weight: Tensor, eps: float, rank: int, pad_ptrs: Tensor | None = None,
                          programs: int = MAX_PROGRAMS) -> tuple[Tensor, Tensor]:
    """The kernel's launcher: ``peer_ptrs`` [world] int64 on the device are the addresses of the ranks' partials
    (contiguous [>= rows, hidden] of ``dtype``, rank order); ``pad_ptrs`` [world] the signal pads' addresses (None:
    no barrier, for plain tensors in one process). Returns (normed, new_residual) as ``fused.add_rmsnorm``."""
    world = peer_ptrs.numel()
    device = peer_ptrs.device
    out = torch.empty((rows, hidden), dtype=torch.promote_types(weight.dtype, dtype), device=device)
    new_residual = torch.empty((rows, hidden), dtype=dtype, device=device)
    if rows == 0:
        return out, new_residual
    res = new_residual if residual is None else residual
    programs = min(rows, programs)
    _allreduce_add_rmsnorm_kernel[(programs,)](
        peer_ptrs, peer_ptrs if pad_ptrs is None else pad_ptrs, res, weight, out, new_residual, rows, programs, hidden,
        float(eps), RANK=rank, WORLD=world, HAS_RESIDUAL=residual is not None, BARRIER=pad_ptrs is not None,
        ROW_STEPS=triton.cdiv(rows, programs), BLOCK_H=triton.next_power_of_2(hidden),
        num_warps=_warps(hidden))  # add_rmsnorm's block and warps: its reduction's bits
    return out, new_residual


@dataclass
class PartialSum:
    """This rank's un-reduced product, ``tensor`` a view of ``reducer``'s symmetric buffer: the next norm sums it
    (``add_rmsnorm``), or ``reduced`` makes it an ordinary all-reduced tensor (any other consumer)."""

    tensor: Tensor
    reducer: "SymmetricAllReduceNorm"

    def add_rmsnorm(self, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        return self.reducer.add_rmsnorm(self.tensor, residual, weight, eps)

    def reduced(self) -> Tensor:
        import torch.distributed as dist

        out = self.tensor.clone()  # the buffer is the next GEMM's
        dist.all_reduce(out, group=self.reducer.group)
        return out


class SymmetricAllReduceNorm:
    """A symmetric buffer of ``max_rows`` x ``hidden`` on each rank of ``group`` (None: the default group), its
    peers' addresses and signal pads; ``partial`` puts a rank's GEMM there, ``add_rmsnorm`` runs the fused kernel.
    Collective to build (``create``)."""

    def __init__(self, group: Any, max_rows: int, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.group, self.max_rows, self.hidden, self.dtype = group, max_rows, hidden, dtype
        pg = group if group is not None else dist.group.WORLD
        self.buffer = symm_mem.empty(max_rows * hidden, dtype=dtype, device=device)
        handle = symm_mem.rendezvous(self.buffer, pg.group_name)
        self.rank, self.world = handle.rank, handle.world_size
        offset = self.buffer.data_ptr() - handle.buffer_ptrs[self.rank]  # a pool's allocation: same on every rank
        self.peer_ptrs = torch.tensor([p + offset for p in handle.buffer_ptrs], dtype=torch.int64, device=device)
        self.pad_ptrs = torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device)
        pad_bytes = handle.get_signal_pad(self.rank).numel() * handle.get_signal_pad(self.rank).element_size()
        self.programs = min(MAX_PROGRAMS, pad_bytes // (4 * self.world))  # one int32 slot per (program, rank)
        self._handle = handle  # keeps the mapping alive

    @classmethod
    def create(cls, group: Any, max_rows: int, hidden: int, dtype: torch.dtype, device: torch.device
               ) -> "SymmetricAllReduceNorm | None":
        """Collective. The reducer, or None on every rank where any rank cannot have one (no CUDA or Triton, a
        world size other than 2, 4, 8, symmetric memory unavailable): the ranks must agree, as they launch the
        same kernels."""
        import torch.distributed as dist

        if torch.device(device).type != "cuda" or not dist.is_initialized():
            return None
        reducer = None
        if fused_available(device) and dist.get_world_size(group) in WORLD_SIZES:
            try:
                reducer = cls(group, max_rows, hidden, dtype, device)
            except Exception:  # no peer access, an old torch: the NCCL path, on every rank (below)
                reducer = None
        ok = torch.tensor([int(reducer is not None and reducer.programs >= 1)], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        return reducer if ok.item() else None

    def fits(self, x: Tensor) -> bool:
        return x.dim() == 2 and x.shape[0] <= self.max_rows and x.dtype == self.dtype and x.is_cuda

    def partial(self, x: Tensor, weight: Tensor) -> PartialSum:
        """x [rows, in] @ weight[out = hidden, in]^T into this rank's buffer, un-reduced."""
        view = self.buffer[: x.shape[0] * self.hidden].view(x.shape[0], self.hidden)
        torch.mm(x, weight.t(), out=view)
        return PartialSum(view, self)

    def add_rmsnorm(self, partial: Tensor, residual: Tensor | None, weight: Tensor, eps: float
                    ) -> tuple[Tensor, Tensor]:
        if residual is not None and (residual.shape != partial.shape or not residual.is_contiguous()):
            residual = residual.reshape(partial.shape).contiguous()
        return allreduce_add_rmsnorm(self.peer_ptrs, partial.shape[0], self.hidden, self.dtype, residual, weight,
                                     eps, self.rank, self.pad_ptrs, self.programs)


# ---------------------------------------------------------------------------------------------- kernel

if triton is not None:

    @triton.jit
    def _signal_barrier(pad_ptrs, slot, RANK: tl.constexpr, WORLD: tl.constexpr):
        """Program ``slot`` of every rank meets here (module docstring); scalar atomics: one thread each."""
        tl.debug_barrier()  # this program's earlier loads and stores are done before it signals
        for peer in tl.static_range(WORLD):
            remote = tl.load(pad_ptrs + peer).to(tl.pointer_type(tl.int32))
            while tl.atomic_cas(remote + slot * WORLD + RANK, 0, 1, sem="release", scope="sys") != 0:
                pass
        mine = tl.load(pad_ptrs + RANK).to(tl.pointer_type(tl.int32))
        for peer in tl.static_range(WORLD):
            while tl.atomic_cas(mine + slot * WORLD + peer, 1, 0, sem="acquire", scope="sys") != 1:
                pass
        tl.debug_barrier()

    @triton.jit
    def _allreduce_add_rmsnorm_kernel(
        peer_ptrs, pad_ptrs, res_ptr, w_ptr, out_ptr, new_res_ptr, rows, programs, H, eps,
        RANK: tl.constexpr, WORLD: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BARRIER: tl.constexpr,
        ROW_STEPS: tl.constexpr, BLOCK_H: tl.constexpr,
    ):
        pid = tl.program_id(0)
        if BARRIER:  # every peer's partial is written (their GEMMs ran before their kernels)
            _signal_barrier(pad_ptrs, pid, RANK, WORLD)
        cols = tl.arange(0, BLOCK_H)
        dt = new_res_ptr.dtype.element_ty
        w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
        for step in range(ROW_STEPS):  # rows pid, pid + programs, ... (a constant trip count: few variants)
            row = step * programs + pid
            mask = (cols < H) & (row < rows)
            offs = row.to(tl.int64) * H + cols
            total = tl.zeros([BLOCK_H], dtype=tl.float32)
            for peer in tl.static_range(WORLD):  # rank order: every rank adds the same floats in the same order
                part = tl.load(peer_ptrs + peer).to(tl.pointer_type(dt))
                # .cg: past this SM's L1, which may hold a peer's lines from an earlier launch
                total += tl.load(part + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            x = total.to(dt)  # what an all-reduce returns
            # from here fused._add_rmsnorm_kernel's arithmetic, step for step
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + offs, mask=mask, other=0.0)
                x = (r.to(tl.float32) + x.to(tl.float32)).to(dt)
            tl.store(new_res_ptr + offs, x, mask=mask)
            h = x.to(tl.float32)
            variance = tl.sum(h * h, axis=0) / H
            h = (h * tl.rsqrt(variance + eps)).to(dt).to(tl.float32)
            tl.store(out_ptr + offs, (w * h).to(out_ptr.dtype.element_ty), mask=mask)
        if BARRIER:  # every peer has read this rank's buffer: the next GEMM may overwrite it
            _signal_barrier(pad_ptrs, pid, RANK, WORLD)
