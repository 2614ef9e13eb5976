"""The LoRA shrink of a grouped projection: x @ [A_1; A_2; A_3]^T for the adapters of one launch, split along K.

The shrink's output is narrow (rows x the adapters' ranks: 64-192 columns) over a long reduction (the hidden or
intermediate size), so tiling its output alone gives a handful of programs: Qwen2.5-1.5B's down_proj adapter
(rank 64, K 8960) ran 4 programs at 64 rows, each streaming 1.7 MB, a few SMs of the H100 doing a step's worth of
work per layer. Here each program takes 16 rows, 32 adapter columns and one of up to `max_splits` slices of K,
and writes its partial sums (float32) to its own slab of ``partials [splits, rows, ranks]``; the consumer (the base
projection's epilogue, fused_linear._lora_add, or lora_expand) adds the slabs in a fixed order (`lora_xa`):
deterministic, no atomics, no extra launch. K is split only where it is long (`MIN_K_PER_SPLIT`): every consumer
program reads every slab of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.engine.kernels import pdl

try:  # optional: without Triton the callers keep the module calls
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install
    triton = None

# Slabs each consumer program sums, by consumer; both from bench.lora_shrink_sweep (H100, Qwen2.5-1.5B and 7B, rows
# 64 and 256, rank 64, shrink and consumer timed together): the grouped launch's epilogue sums them in every output
# tile's program, so few splits (2; 4 within 2 %); lora_expand's narrow programs gain from a short shrink (16: as 8,
# 5 % less than 4, 17 % less than the old 4 slices of at least 2048).
EPILOGUE_MAX_SPLITS = 2
EXPAND_MAX_SPLITS = 16
MIN_K_PER_SPLIT = 512  # shorter slices cost more in the consumer than their shrink saves
# Tiles: rows and adapter columns per program, the K step, pipeline stages. bench.lora_shrink_sweep --tiles (36
# variants, H100, 1.5B and 7B): 16 x 32 was fastest summed over the ops at 64 rows and at 256, where it took 8 % off
# the old 64 x 16 (small tiles: more programs, A re-read from L2).
_BLOCK_M = 16
_BLOCK_N = 32
_BLOCK_K = 128
_STAGES = 3


@dataclass(frozen=True)
class ShrinkTiles:
    block_m: int
    splits: int
    k_per_split: int  # a multiple of _BLOCK_K


def shrink_tiles(rows: int, ranks: tuple[int, ...], k: int, sms: int, max_splits: int) -> ShrinkTiles:
    """K split in up to `max_splits` slices of at least MIN_K_PER_SPLIT until the launch has about one program per
    SM."""
    tiles = -(-rows // _BLOCK_M) * sum(-(-r // _BLOCK_N) for r in ranks)
    splits = max(1, min(max_splits, k // MIN_K_PER_SPLIT, -(-sms // tiles)))
    k_per_split = -(-k // splits)
    k_per_split = -(-k_per_split // _BLOCK_K) * _BLOCK_K
    return ShrinkTiles(_BLOCK_M, -(-k // k_per_split), k_per_split)


def lora_shrink(x2: Tensor, a_weights: list[Tensor], sms: int, max_splits: int) -> Tensor:
    """partials [splits, rows, sum of ranks] (float32): slab s holds x2 @ A^T over the s-th slice of K, the
    adapters' columns side by side in the order given (up to three). x2 is cast to A's dtype in the kernel (float32
    adapters on a 16-bit model: TF32 dots, as before the split; float32 inputs: IEEE dots)."""
    rows, k = x2.shape
    ranks = tuple(a.shape[0] for a in a_weights)
    t = shrink_tiles(rows, ranks, k, sms, max_splits)
    partials = torch.empty(t.splits, rows, sum(ranks), dtype=torch.float32, device=x2.device)
    pad = 3 - len(a_weights)
    a_ptrs, ranks = a_weights + a_weights[:1] * pad, ranks + (0,) * pad
    col_tiles = sum(triton.cdiv(r, _BLOCK_N) for r in ranks)
    _lora_shrink_kernel[(col_tiles, triton.cdiv(rows, t.block_m), t.splits)](
        x2, *a_ptrs, partials, rows, k, x2.stride(0), *ranks, t.k_per_split,
        BLOCK_M=t.block_m, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K, IEEE=x2.dtype == torch.float32,
        num_warps=4, num_stages=_STAGES, **pdl.launch_options(x2.device))
    return partials


if triton is not None:

    @triton.jit
    def lora_xa(xa_ptr, stride_split, stride_xa, xa_col0, rank, offs_m, M, SPLITS: tl.constexpr,
                BLOCK_R: tl.constexpr):
        """x @ A^T [BLOCK_M, BLOCK_R] (float32) of one adapter for rows offs_m: its columns from xa_col0 of every
        slab of `lora_shrink`'s partials, added in slab order; columns past `rank` and rows past M are zero."""
        r = tl.arange(0, BLOCK_R)
        ptrs = xa_ptr + offs_m[:, None] * stride_xa + xa_col0 + r[None, :]
        mask = (offs_m[:, None] < M) & (r < rank)[None, :]
        xa = tl.load(ptrs, mask=mask, other=0.0)
        for s in range(1, SPLITS):
            xa += tl.load(ptrs + s * stride_split, mask=mask, other=0.0)
        return xa

    @triton.jit
    def _shrink_tile(x_ptr, a_ptr, out_ptr, offs_m, col0, out_col0, M, R, K, k_lo, k_hi, stride_xm, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        """out[offs_m, out_col0 + col0 + j] = x[offs_m, k_lo:k_hi] @ A[col0 + j, k_lo:k_hi]^T, j < BLOCK_N."""
        offs_n = col0 + tl.arange(0, BLOCK_N)
        offs_k = k_lo + tl.arange(0, BLOCK_K)
        m_ok = offs_m[:, None] < M
        n_ok = offs_n[None, :] < R
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        a_ptrs = a_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]  # A^T tile [BLOCK_K, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(k_lo, k_hi, BLOCK_K):
            k_ok = offs_k < k_hi
            x = tl.load(x_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
            a = tl.load(a_ptrs, mask=n_ok & k_ok[:, None], other=0.0)
            if IEEE:  # float32 inputs: no TF32, to match torch's float32 matmul
                acc = tl.dot(x.to(a.dtype), a, acc, input_precision="ieee")
            else:
                acc = tl.dot(x.to(a.dtype), a, acc)
            x_ptrs += BLOCK_K
            a_ptrs += BLOCK_K
            offs_k += BLOCK_K
        tl.store(out_ptr + offs_m[:, None] * stride_om + (out_col0 + offs_n)[None, :], acc, mask=m_ok & n_ok)

    @triton.jit
    def _lora_shrink_kernel(
        x_ptr, a1_ptr, a2_ptr, a3_ptr, out_ptr, M, K, stride_xm, R1, R2, R3, K_PER_SPLIT,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (column tiles: adapter 1's, then 2's, then 3's; row tiles; K slices). Slab `split` of out.
        pdl.pdl_enter(PDL)
        pid_n = tl.program_id(0)
        offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        split = tl.program_id(2)
        k_lo = split * K_PER_SPLIT
        k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
        ranks = R1 + R2 + R3
        out = out_ptr + split.to(tl.int64) * M * ranks
        tiles_1 = tl.cdiv(R1, BLOCK_N)
        tiles_2 = tl.cdiv(R2, BLOCK_N)
        if pid_n < tiles_1:
            _shrink_tile(x_ptr, a1_ptr, out, offs_m, pid_n * BLOCK_N, 0, M, R1, K, k_lo, k_hi, stride_xm, ranks,
                         BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
        elif pid_n < tiles_1 + tiles_2:
            _shrink_tile(x_ptr, a2_ptr, out, offs_m, (pid_n - tiles_1) * BLOCK_N, R1, M, R2, K, k_lo, k_hi,
                         stride_xm, ranks, BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
        else:
            _shrink_tile(x_ptr, a3_ptr, out, offs_m, (pid_n - tiles_1 - tiles_2) * BLOCK_N, R1 + R2, M, R3, K,
                         k_lo, k_hi, stride_xm, ranks, BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
