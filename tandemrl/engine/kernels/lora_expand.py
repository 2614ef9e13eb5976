"""The LoRA expand on its own: ``out_i += ((x A_i^T) B_i^T) * scaling_i`` into outputs a GEMM already wrote.

Above the GEMV range, where cuBLAS computes the base projections (linear_dispatch.py), an adapted group
runs as: cuBLAS base projections, one `lora_shrink` for the group's adapters (partials [splits, rows, ranks]), then
one launch of this kernel for up to three outputs (column views of one buffer or separate tensors). Each program
owns a [BLOCK_M, BLOCK_N] tile of one output: it adds the shrink's slabs of its rows (`lora_xa`), multiplies by the
B^T tile on tensor cores (the rank in steps of up to 64; TF32 for float32 adapters on a 16-bit model, as the
shrink, IEEE for float32 models), and reads, adds and writes back its output tile: no atomics, deterministic.

Rounding: peft's. The base output arrives rounded to its dtype (cuBLAS, as peft's base_layer call); lora_B's
product is rounded to the adapter's dtype, multiplied by scaling and rounded again, added to the base in float32
and rounded once to the output's dtype: ``result + lora_B(lora_A(x)) * scaling`` with type promotion, then the cast
back (`peft_rounded_add`, which the grouped kernels' epilogue, fused_linear._lora_add, calls too).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandemrl.engine.kernels import pdl

try:  # optional: without Triton the callers keep the module calls
    import triton
    import triton.language as tl

    from tandemrl.engine.kernels.lora_shrink import lora_xa
except Exception:  # pragma: no cover - missing or broken install
    triton = None

MAX_OUTPUTS = 3
_MAX_RANK_STEP = 64  # rank columns per tl.dot: a rank up to 128 takes one or two


def expand_tiles(rows: int, widths: tuple[int, ...], sms: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): the smallest of 16/32/64 row tiles holding the rows (64 above), and the widest of
    128/64/32 column tiles that still gives about one program per SM. The expand moves bytes (each output element
    read and written once, B re-read per row tile from L2), so the launch wants every SM, not long tiles."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    row_tiles = -(-rows // block_m)
    for block_n in (128, 64):
        if row_tiles * sum(-(-w // block_n) for w in widths) >= sms:
            return block_m, block_n
    return block_m, 32


def lora_expand_(outs: list[Tensor], xa: Tensor, b_weights: list[Tensor], scalings: list[float], sms: int) -> None:
    """outs[i] (2-D [rows, N_i], unit column stride) += scalings[i] * (sum over slabs of xa[:, :, cols of adapter
    i]) @ b_weights[i]^T, in place, rounded as peft (module doc). xa: `lora_shrink`'s partials [splits, rows, sum of
    ranks], adapter i's columns after those of adapters 0..i-1; b_weights[i]: [N_i, rank_i], contiguous."""
    if not 1 <= len(outs) <= MAX_OUTPUTS or not len(outs) == len(b_weights) == len(scalings):
        raise ValueError(f"lora_expand_: 1 to {MAX_OUTPUTS} outputs, each with its B and scaling")
    rows = xa.shape[1]
    ranks = [b.shape[1] for b in b_weights]
    if sum(ranks) != xa.shape[2] or any(o.shape != (rows, b.shape[0]) or o.stride(1) != 1
                                        for o, b in zip(outs, b_weights)):
        raise ValueError("lora_expand_: outputs, B weights and partials disagree in shape")
    widths = tuple(o.shape[1] for o in outs)
    if rows == 0 or not any(widths):
        return
    block_m, block_n = expand_tiles(rows, widths, sms)
    pad = MAX_OUTPUTS - len(outs)  # absent outputs: no columns, never read
    outs_p, b_p = outs + outs[:1] * pad, b_weights + b_weights[:1] * pad
    col_tiles = sum(triton.cdiv(n, block_n) for n in widths)
    rank_step = min(_MAX_RANK_STEP, max(16, triton.next_power_of_2(max(ranks))))
    _lora_expand_kernel[(col_tiles, triton.cdiv(rows, block_m))](
        xa, xa.stride(1), xa.stride(0), *outs_p, *(o.stride(0) for o in outs_p), *widths, *(0,) * pad,
        *b_p, *ranks, *(0,) * pad, *(float(s) for s in scalings), *(0.0,) * pad, rows,
        SPLITS=xa.shape[0], BLOCK_M=block_m, BLOCK_N=block_n, RANK_STEP=rank_step,
        IEEE=outs[0].dtype == torch.float32, num_warps=4, num_stages=2, **pdl.launch_options(xa.device))


if triton is not None:

    @triton.jit
    def peft_rounded_add(base, delta, scaling, ad):
        """base + delta * scaling in float32, rounded as peft does (module doc): lora_B's product delta (float32)
        rounded to the adapter's dtype ad, times scaling, rounded again; base is the output already rounded to its
        dtype. The caller rounds the sum to the output's dtype. Shared with the grouped kernels' epilogue."""
        return base + (delta.to(ad).to(tl.float32) * scaling).to(ad).to(tl.float32)

    @triton.jit
    def _expand_tile(out_ptr, stride_om, N, col0, offs_m, M, xa_ptr, stride_xa, stride_split, xa_col0, b_ptr, rank,
                     scaling, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     RANK_STEP: tl.constexpr, IEEE: tl.constexpr):
        """out[offs_m, col0 + j] += lora term, j < BLOCK_N, masked to M x N; B [N, rank] row-major."""
        ad = b_ptr.dtype.element_ty
        offs_n = col0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, rank, RANK_STEP):
            # lora_A's output in the adapter's dtype, as lora_B reads it
            xa = lora_xa(xa_ptr, stride_split, stride_xa, xa_col0 + r0, rank - r0, offs_m, M, SPLITS,
                         RANK_STEP).to(ad)
            r = r0 + tl.arange(0, RANK_STEP)
            b_t = tl.load(b_ptr + offs_n[None, :].to(tl.int64) * rank + r[:, None],
                          mask=(r < rank)[:, None] & n_ok[None, :], other=0.0)  # B^T tile [RANK_STEP, BLOCK_N]
            if IEEE:  # float32 model: no TF32, to match torch's float32 matmul
                acc = tl.dot(xa, b_t, acc, input_precision="ieee")
            else:
                acc = tl.dot(xa, b_t, acc)
        mask = (offs_m[:, None] < M) & n_ok[None, :]
        ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        base = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptrs, peft_rounded_add(base, acc, scaling, ad).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _lora_expand_kernel(
        xa_ptr, stride_xa, stride_split, o1_ptr, o2_ptr, o3_ptr, so1, so2, so3, N1, N2, N3, b1_ptr, b2_ptr, b3_ptr,
        R1, R2, R3, S1, S2, S3, M, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        RANK_STEP: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
    ):
        # grid (column tiles: output 1's, then 2's, then 3's; row tiles): a uniform branch per program. Output i's
        # xa columns start after the ranks of the outputs before it.
        pdl.pdl_enter(PDL)
        pid_n = tl.program_id(0)
        offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        tiles_1 = tl.cdiv(N1, BLOCK_N)
        tiles_2 = tl.cdiv(N2, BLOCK_N)
        if pid_n < tiles_1:
            _expand_tile(o1_ptr, so1, N1, pid_n * BLOCK_N, offs_m, M, xa_ptr, stride_xa, stride_split, 0, b1_ptr, R1,
                         S1, SPLITS, BLOCK_M, BLOCK_N, RANK_STEP, IEEE)
        elif pid_n < tiles_1 + tiles_2:
            _expand_tile(o2_ptr, so2, N2, (pid_n - tiles_1) * BLOCK_N, offs_m, M, xa_ptr, stride_xa, stride_split,
                         R1, b2_ptr, R2, S2, SPLITS, BLOCK_M, BLOCK_N, RANK_STEP, IEEE)
        else:
            _expand_tile(o3_ptr, so3, N3, (pid_n - tiles_1 - tiles_2) * BLOCK_N, offs_m, M, xa_ptr, stride_xa,
                         stride_split, R1 + R2, b3_ptr, R3, S3, SPLITS, BLOCK_M, BLOCK_N, RANK_STEP, IEEE)
