"""Grouped projections: several of a layer's nn.Linear modules in one Triton launch, reading their own weights.

- ``qkv_projection``: q_proj, k_proj and v_proj of an attention block into one [N, Nq + Nk + Nv] buffer.
- ``gate_up_silu``: silu(gate_proj(x)) * up_proj(x) of a SiLU-gated MLP, the product in the epilogue.
- ``lora_projection``: one peft LoRA Linear (o_proj, down_proj): cuBLAS, then the adapter's shrink and expand.

Zero copy: the kernels take each module's weight pointer, never a concatenation, so an optimizer step on the
trainer's parameters is seen by the next call. peft LoRA Linear layers (lora.py) are served too: one launch
computes x @ A^T of every adapter of the group (lora_shrink.py: split along K, partial sums per slice), and the
base projection's epilogue adds the slices and (x A^T) B^T * scaling, rounded as peft does; the adapter's A and B
are peft's parameters, nothing is merged. An adapted group the dispatch rule (linear_dispatch.py) gives to cuBLAS
runs its base projections on cuBLAS as a plain group would (F.linear), then the same shrink and one `lora_expand_`
launch adding the adapters' products to those outputs in place (tensor cores, peft's rounding), not peft's module
chain. The launchers return None where they do not apply (hooks; merged, disabled or DoRA adapters; mixed dtypes;
autograd; too many rows; plain groups at shapes where cuBLAS wins) and the caller uses the modules.

Kernel: grid (column tiles of the concatenated output, row tiles of x); a column tile never straddles two weights
(each weight has its own run of tiles, the last one masked); tiles from linear_tiles.py. Above the GEMV range
gate/up is a compute-bound GEMM, and on Hopper its tiles come through the bulk tensor copy engine (TMA, host tensor
descriptors; `python -m bench.tma_probe`: 13.8 vs 15.3 us per layer at 256 rows, 10.8 vs 13.7 at 128); the GEMV
range keeps plain loads, as do inputs whose pointers or strides TMA cannot take.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tandemrl.engine.kernels import pdl
from tandemrl.engine.kernels.fused import is_silu_mlp, silu_mul
from tandemrl.engine.kernels.linear_dispatch import route_group
from tandemrl.engine.kernels.linear_tiles import DEFAULT_SMS, GEMV_ROWS, LinearTiles, pick_tiles, tma_gate_up_tiles
from tandemrl.engine.kernels.lora import LoraParts
from tandemrl.engine.kernels.lora_expand import lora_expand_
from tandemrl.engine.kernels import lora_shrink as shrink  # its limits read at call time (bench.lora_shrink_sweep)

try:  # optional: without Triton the callers keep the module calls
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tandemrl.engine.kernels.lora_expand import peft_rounded_add
    from tandemrl.engine.kernels.lora_shrink import lora_xa
except Exception:  # pragma: no cover - missing or broken install
    triton = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)


# ---------------------------------------------------------------------------------------------- device

@functools.lru_cache(maxsize=None)
def _device_properties(device: torch.device):
    """Asked once per device: a host query, safe during CUDA graph capture."""
    return torch.cuda.get_device_properties(device)


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`."""
    return _device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_SMS


def _tma_ready(*tensors: Tensor) -> bool:
    """Whether tensor descriptors can address these 2-D tensors: Hopper or newer (or the interpreter), 16-byte
    aligned base pointers and row strides, unit column stride."""
    device = tensors[0].device
    if not (_INTERPRET or (device.type == "cuda" and _device_properties(device).major >= 9)):
        return False
    return all(t.data_ptr() % 16 == 0 and t.stride(1) == 1 and t.stride(0) * t.element_size() % 16 == 0
               for t in tensors)


def _new_output(rows: int, cols: int, like: Tensor) -> Tensor:
    """The launch's output buffer (a seam: tests fill it with NaN so unwritten elements show)."""
    return torch.empty(rows, cols, dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------------------------------------- launchers

def qkv_projection(
    attn: nn.Module, x: Tensor, *, max_rows: int | None = None, tiles: LinearTiles | None = None,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """(q_proj(x), k_proj(x), v_proj(x)) in one launch, as column views of one [..., Nq + Nk + Nv] buffer; peft
    LoRA projections with their adapter's product added in the same launch (`lora_shrink` first). An adapted
    group the grouped launch declines: `_cublas_with_lora` (three separate tensors).

    None where it does not apply (see the module doc); max_rows: None reads linear_dispatch's
    GROUPED_LINEAR_MAX_ROWS at call time.
    tiles: None picks them (`pick_tiles`); benchmarks pass their own.
    """
    projs = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    group = route_group("qkv", projs, x, max_rows)
    if group is None:
        return None
    operands = group.operands
    if not group.grouped:
        q, k, v = _cublas_with_lora(operands, x)
        return q, k, v  # separate [..., N] tensors
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    rows = x2.shape[0]
    nq, nk, nv = (base.weight.shape[0] for base, _ in operands)
    out = _new_output(rows, nq + nk + nv, x)
    if rows:
        _grouped_linear(x2, [base.weight for base, _ in operands], [base.bias for base, _ in operands], out,
                        tiles, [parts for _, parts in operands])
    q, k, v = out[:, :nq], out[:, nq:nq + nk], out[:, nq + nk:]
    if x.dim() == 2:  # the decoder's case: keep the views as they are (row stride nq + nk + nv)
        return q, k, v
    lead = x.shape[:-1]
    return q.view(*lead, nq), k.view(*lead, nk), v.view(*lead, nv)


def lora_projection(module: nn.Module, x: Tensor, *, max_rows: int | None = None) -> Tensor | None:
    """A peft LoRA Linear's output: its base projection on cuBLAS, then its adapter's shrink and expand
    (`_cublas_with_lora`; faster than one grouped launch with the adapter in its epilogue: linear_dispatch); None for
    anything else (a plain nn.Linear stays the module call), or where the kernels do not apply."""
    group = route_group("proj", [module], x, max_rows)
    return None if group is None else _cublas_with_lora(group.operands, x)[0]


def _grouped_linear(x2: Tensor, weights: list[Tensor], biases: list[Tensor | None], out: Tensor,
                    tiles: LinearTiles | None, adapters: list[LoraParts | None]) -> None:
    """out[:, columns of weight i] = x2 @ weights[i]^T (+ bias) (+ its adapter's product), up to three weights in
    one launch. Float32 dots are exact for float32 inputs; a 16-bit model's float32 adapters get TF32 (here and in
    lora_shrink), whose error stays below the rounding of the 16-bit outputs they end in."""
    rows, K = x2.shape
    widths = [w.shape[0] for w in weights]
    elem = max(x2.element_size(), weights[0].element_size())
    t = tiles if tiles is not None else pick_tiles(rows, tuple(widths), K, elem, 1, _sm_count(x2.device))
    col_tiles = sum(triton.cdiv(n, t.block_n) for n in widths)
    pad = 3 - len(weights)  # absent weights: no columns, never read
    weights, biases, widths = weights + weights[:1] * pad, biases + [None] * pad, widths + [0] * pad
    lora = _lora_operands(x2, adapters + [None] * pad, out)
    _grouped_linear_kernel[(col_tiles, triton.cdiv(rows, t.block_m))](
        x2, *weights, *(_or(b, w) for b, w in zip(biases, weights)), out,
        rows, K, x2.stride(0), out.stride(0), *widths, *lora.pop("args"),
        HAS_BQ=biases[0] is not None, HAS_BK=biases[1] is not None, HAS_BV=biases[2] is not None,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, EVEN_K=K % t.block_k == 0,
        IEEE=x2.dtype == torch.float32, num_warps=t.num_warps, num_stages=t.num_stages, **lora,
        **pdl.launch_options(x2.device))


def _cublas_with_lora(operands: list[tuple[nn.Linear, LoraParts | None]], x: Tensor) -> list[Tensor]:
    """Each base projection of x as the module path runs it (cuBLAS, F.linear on the base weight and bias), then
    one `lora_shrink` for the group's adapters and one `lora_expand_` adding their products to the outputs in
    place (peft's rounding: lora_expand.py)."""
    outs = [F.linear(x, base.weight, base.bias) for base, _ in operands]
    adapted = [(out, parts) for out, (_, parts) in zip(outs, operands) if parts is not None]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0]:
        sms = _sm_count(x.device)
        xa = shrink.lora_shrink(x2, [p.a for _, p in adapted], sms, shrink.EXPAND_MAX_SPLITS)
        lora_expand_([out.view(-1, out.shape[-1]) for out, _ in adapted], xa, [p.b for _, p in adapted],
                     [p.scaling for _, p in adapted], sms)
    return outs


def _lora_operands(x2: Tensor, adapters: list[LoraParts | None], dummy: Tensor) -> dict:
    """The LoRA arguments of a grouped launch: ``args`` (xa: the shrink's partials [splits, rows, ranks], its row and
    slab strides, then each weight's B, rank and scaling; rank 0 where a weight has no adapter) and the constexprs.
    xa comes from `lora_shrink` (one launch for the group); without adapters the pointers are dummies never read."""
    present = [p for p in adapters if p is not None]
    if not present:
        return {"args": [dummy, 0, 0] + [dummy] * len(adapters) + [0] * len(adapters) + [0.0] * len(adapters),
                "HAS_LORA": False, "XA_SPLITS": 1, "BLOCK_R": 16, "LORA_IEEE": False}
    xa = shrink.lora_shrink(x2, [p.a for p in present], _sm_count(x2.device), shrink.EPILOGUE_MAX_SPLITS)
    return {"args": [xa, xa.stride(1), xa.stride(0)] + [p.b if p else xa for p in adapters]
            + [p.rank if p else 0 for p in adapters] + [p.scaling if p else 0.0 for p in adapters],
            "HAS_LORA": True, "XA_SPLITS": xa.shape[0],
            "BLOCK_R": max(16, triton.next_power_of_2(max(p.rank for p in present))),
            "LORA_IEEE": x2.dtype == torch.float32}


def gate_up_silu(
    mlp: nn.Module, x: Tensor, *, max_rows: int | None = None, tiles: LinearTiles | None = None,
    tma: bool | None = None,
) -> Tensor | None:
    """silu(gate_proj(x)) * up_proj(x) in one launch, rounded as ``fused.silu_mul_ref(gate_proj(x), up_proj(x))``
    (gate and up rounded to the dtype, then silu rounded, then the product); peft LoRA projections with their
    adapter's product added (after `lora_shrink`, plain loads). None where it does not apply.

    The engine passes neither tiles nor tma: above the GEMV range tensor descriptors where they apply (`_use_tma`)
    with the measured `tma_gate_up_tiles`, otherwise plain loads with `pick_tiles`. Benchmarks pass their own tiles
    (for whichever kernel runs) and may force descriptors (tma=True) or plain loads (tma=False).
    """
    group = route_group("gate_up", [mlp.gate_proj, mlp.up_proj], x, max_rows) if is_silu_mlp(mlp) else None
    if group is None:
        return None
    (gate, gate_lora), (up, up_lora) = group.operands
    if gate.weight.shape != up.weight.shape:
        return None
    if not group.grouped:  # cuBLAS gate and up, their adapters added in one launch, then the SiLU product
        return silu_mul(*_cublas_with_lora(group.operands, x))
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    rows, inter = x2.shape[0], gate.weight.shape[0]
    out = _new_output(rows, inter, x)
    adapted = gate_lora is not None or up_lora is not None  # the adapter's epilogue: plain loads only
    if rows and not adapted and _use_tma(rows, tma, x2, gate.weight, up.weight):
        t = tiles if tiles is not None else tma_gate_up_tiles(rows, x.element_size())
        _gate_up_silu_tma(x2, gate, up, out, t)
    elif rows:
        t = tiles if tiles is not None else pick_tiles(rows, (inter,), K, x.element_size(), 2, _sm_count(x.device))
        lora = _lora_operands(x2, [gate_lora, up_lora], out)
        _gate_up_silu_kernel[(triton.cdiv(inter, t.block_n), triton.cdiv(rows, t.block_m))](
            x2, gate.weight, up.weight, _or(gate.bias, gate.weight), _or(up.bias, up.weight), out,
            rows, inter, K, x2.stride(0), out.stride(0), *lora.pop("args"), **lora,
            HAS_BG=gate.bias is not None, HAS_BU=up.bias is not None,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, EVEN_K=K % t.block_k == 0,
            IEEE=x.dtype == torch.float32, num_warps=t.num_warps, num_stages=t.num_stages,
            **pdl.launch_options(x.device))
    return out.view(*x.shape[:-1], inter)


def _use_tma(rows: int, tma: bool | None, *tensors: Tensor) -> bool:
    """tma None: the engine's rule, descriptors above the GEMV range where they can address the operands. An
    explicit True that descriptors cannot serve raises rather than timing the other kernel under its name."""
    if tma is None:
        return rows > GEMV_ROWS and _tma_ready(*tensors)
    if tma and not _tma_ready(*tensors):
        raise ValueError("gate_up_silu: tma=True needs Hopper (or the interpreter) and 16-byte aligned operands")
    return tma


def _gate_up_silu_tma(x: Tensor, gate: nn.Linear, up: nn.Linear, out: Tensor, t: LinearTiles) -> None:
    """The large-batch launch: x [rows, K] and both weights read through tensor descriptors (out-of-range rows,
    columns and K steps come back as zeros, so the loads need no masks)."""
    rows, inter = out.shape
    x_desc = TensorDescriptor.from_tensor(x, [t.block_m, t.block_k])
    g_desc, u_desc = (TensorDescriptor.from_tensor(w, [t.block_n, t.block_k]) for w in (gate.weight, up.weight))
    _gate_up_silu_tma_kernel[(triton.cdiv(inter, t.block_n), triton.cdiv(rows, t.block_m))](
        x_desc, g_desc, u_desc, _or(gate.bias, gate.weight), _or(up.bias, up.weight), out,
        rows, inter, x.shape[1], out.stride(0), HAS_BG=gate.bias is not None, HAS_BU=up.bias is not None,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, STAGES=t.num_stages,
        IEEE=x.dtype == torch.float32, num_warps=t.num_warps, **pdl.launch_options(x.device))


def _or(bias: Tensor | None, dummy: Tensor) -> Tensor:
    """A pointer for an absent bias (never read: HAS_B* is False)."""
    return dummy if bias is None else bias


# ---------------------------------------------------------------------------------------------- kernels

if triton is not None:

    @triton.jit
    def _dot_step(x, w, acc, IEEE: tl.constexpr):
        if IEEE:  # float32 inputs: no TF32, to match torch's float32 matmul
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
        return acc

    @triton.jit
    def _k_step_masks(m_mask, n_mask, offs_k, k_left, EVEN_K: tl.constexpr):
        """Load masks of the x tile [BLOCK_M, BLOCK_K] and a W^T tile [BLOCK_K, BLOCK_N] at a reduction step with
        k_left columns of K still to go (whole BLOCK_K steps need no K mask)."""
        if EVEN_K:
            x_mask = m_mask
            w_mask = n_mask
        else:
            k_ok = offs_k < k_left
            x_mask = m_mask & k_ok[None, :]
            w_mask = n_mask & k_ok[:, None]
        return x_mask, w_mask

    @triton.jit
    def _lora_add(acc, xa_ptr, stride_xa, stride_split, xa_col0, lb_ptr, rank, scaling, offs_m, offs_n, M, N,
                  out_dtype, XA_SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, LORA_IEEE: tl.constexpr):
        """The float32 tile of a base projection (bias added) plus its LoRA product, rounded as peft does: lora_A's
        output (x A^T, the shrink's slabs added: `lora_xa`), lora_B(xa) and its product with scaling in the
        adapter's dtype, the base output in out_dtype, their sum in the wider one. This weight's xa columns start at
        xa_col0; B [N, rank]."""
        ad = lb_ptr.dtype.element_ty
        r = tl.arange(0, BLOCK_R)
        xa = lora_xa(xa_ptr, stride_split, stride_xa, xa_col0, rank, offs_m, M, XA_SPLITS, BLOCK_R).to(ad)
        b_t = tl.load(lb_ptr + offs_n[None, :].to(tl.int64) * rank + r[:, None],
                      mask=(r < rank)[:, None] & (offs_n[None, :] < N), other=0.0)  # B^T tile [BLOCK_R, BLOCK_N]
        if LORA_IEEE:
            delta = tl.dot(xa, b_t, input_precision="ieee")
        else:
            delta = tl.dot(xa, b_t)
        return peft_rounded_add(acc.to(out_dtype).to(tl.float32), delta, scaling, ad)

    @triton.jit
    def _linear_tile(
        x_ptr, w_ptr, b_ptr, out_ptr, offs_m, col0, out_col0, M, N, K: tl.constexpr, stride_xm, stride_om,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr, IEEE: tl.constexpr,
        xa_ptr, stride_xa, stride_split, xa_col0, lb_ptr, rank, scaling, HAS_LORA: tl.constexpr,
        XA_SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, LORA_IEEE: tl.constexpr,
    ):
        """out[offs_m, out_col0 + col0 + j] = x[offs_m] @ W[col0 + j]^T (+ b) (+ the LoRA product), j < BLOCK_N,
        masked to M x N."""
        offs_n = col0 + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_mask = offs_m[:, None] < M
        n_mask = offs_n[None, :] < N
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]  # W^T tile [BLOCK_K, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x_mask, w_mask = _k_step_masks(m_mask, n_mask, offs_k, K - k0, EVEN_K)
            x = tl.load(x_ptrs, mask=x_mask, other=0.0)
            w = tl.load(w_ptrs, mask=w_mask, other=0.0)
            acc = _dot_step(x, w, acc, IEEE)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:  # nn.Linear adds the bias in float32 and rounds once
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        if HAS_LORA:
            acc = _lora_add(acc, xa_ptr, stride_xa, stride_split, xa_col0, lb_ptr, rank, scaling, offs_m, offs_n,
                            M, N, out_ptr.dtype.element_ty, XA_SPLITS, BLOCK_R, LORA_IEEE)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + (out_col0 + offs_n)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask & n_mask)

    @triton.jit
    def _grouped_linear_kernel(
        x_ptr, wq_ptr, wk_ptr, wv_ptr, bq_ptr, bk_ptr, bv_ptr, out_ptr, M, K: tl.constexpr, stride_xm, stride_om,
        NQ, NK, NV, xa_ptr, stride_xa, stride_split, lbq_ptr, lbk_ptr, lbv_ptr, RQ, RK, RV, SQ, SK, SV,
        HAS_BQ: tl.constexpr, HAS_BK: tl.constexpr, HAS_BV: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
        HAS_LORA: tl.constexpr, XA_SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, LORA_IEEE: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # Up to three weights side by side in the output (q/k/v; one projection: NK = NV = 0).
        # Column tiles 0..TQ-1 belong to the first, the next TK to the second, the rest to the third: a uniform
        # branch per program. Weight i's LoRA: B at lb*, rank R*, scaling S*, its xa columns after the others'.
        pdl.pdl_enter(PDL)
        pid_n = tl.program_id(0)
        offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        tiles_q = tl.cdiv(NQ, BLOCK_N)
        tiles_k = tl.cdiv(NK, BLOCK_N)
        if pid_n < tiles_q:
            _linear_tile(x_ptr, wq_ptr, bq_ptr, out_ptr, offs_m, pid_n * BLOCK_N, 0, M, NQ, K, stride_xm,
                         stride_om, HAS_BQ, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE,
                         xa_ptr, stride_xa, stride_split, 0, lbq_ptr, RQ, SQ, HAS_LORA, XA_SPLITS, BLOCK_R,
                         LORA_IEEE)
        elif pid_n < tiles_q + tiles_k:
            _linear_tile(x_ptr, wk_ptr, bk_ptr, out_ptr, offs_m, (pid_n - tiles_q) * BLOCK_N, NQ, M, NK, K,
                         stride_xm, stride_om, HAS_BK, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE,
                         xa_ptr, stride_xa, stride_split, RQ, lbk_ptr, RK, SK, HAS_LORA, XA_SPLITS, BLOCK_R,
                         LORA_IEEE)
        else:
            _linear_tile(x_ptr, wv_ptr, bv_ptr, out_ptr, offs_m, (pid_n - tiles_q - tiles_k) * BLOCK_N, NQ + NK,
                         M, NV, K, stride_xm, stride_om, HAS_BV, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE,
                         xa_ptr, stride_xa, stride_split, RQ + RK, lbv_ptr, RV, SV, HAS_LORA, XA_SPLITS,
                         BLOCK_R, LORA_IEEE)

    @triton.jit
    def _gate_up_silu_kernel(
        x_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, out_ptr, M, N, K: tl.constexpr, stride_xm, stride_om,
        xa_ptr, stride_xa, stride_split, lbg_ptr, lbu_ptr, RG, RU, SG, SU,
        HAS_BG: tl.constexpr, HAS_BU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, HAS_LORA: tl.constexpr,
        XA_SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, LORA_IEEE: tl.constexpr, PDL: tl.constexpr,
    ):
        # The same columns of gate and up in one program: x is loaded once for both dots.
        pdl.pdl_enter(PDL)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        m_mask = offs_m[:, None] < M
        n_mask = offs_n[None, :] < N
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        w_off = offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
        g_ptrs = wg_ptr + w_off
        u_ptrs = wu_ptr + w_off
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x_mask, w_mask = _k_step_masks(m_mask, n_mask, offs_k, K - k0, EVEN_K)
            x = tl.load(x_ptrs, mask=x_mask, other=0.0)
            wg = tl.load(g_ptrs, mask=w_mask, other=0.0)
            wu = tl.load(u_ptrs, mask=w_mask, other=0.0)
            acc_g = _dot_step(x, wg, acc_g, IEEE)
            acc_u = _dot_step(x, wu, acc_u, IEEE)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        acc_g, acc_u = _biases(acc_g, acc_u, bg_ptr, bu_ptr, offs_n, N, HAS_BG, HAS_BU)
        if HAS_LORA:  # gate's adapter columns of xa first, then up's
            dt = out_ptr.dtype.element_ty
            acc_g = _lora_add(acc_g, xa_ptr, stride_xa, stride_split, 0, lbg_ptr, RG, SG, offs_m, offs_n, M, N, dt,
                              XA_SPLITS, BLOCK_R, LORA_IEEE)
            acc_u = _lora_add(acc_u, xa_ptr, stride_xa, stride_split, RG, lbu_ptr, RU, SU, offs_m, offs_n, M, N, dt,
                              XA_SPLITS, BLOCK_R, LORA_IEEE)
        _silu_product_store(acc_g, acc_u, out_ptr, offs_m, offs_n, M, N, stride_om)

    @triton.jit
    def _gate_up_silu_tma_kernel(
        x_desc, g_desc, u_desc, bg_ptr, bu_ptr, out_ptr, M, N, K, stride_om,
        HAS_BG: tl.constexpr, HAS_BU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, STAGES: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
    ):
        # _gate_up_silu_kernel with descriptor loads: the copy engine fills shared memory, no address arithmetic
        pdl.pdl_enter(PDL)
        off_n = tl.program_id(0) * BLOCK_N
        off_m = tl.program_id(1) * BLOCK_M
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            x = x_desc.load([off_m, k])
            acc_g = _dot_step(x, g_desc.load([off_n, k]).T, acc_g, IEEE)
            acc_u = _dot_step(x, u_desc.load([off_n, k]).T, acc_u, IEEE)
        offs_m = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc_g, acc_u = _biases(acc_g, acc_u, bg_ptr, bu_ptr, offs_n, N, HAS_BG, HAS_BU)
        _silu_product_store(acc_g, acc_u, out_ptr, offs_m, offs_n, M, N, stride_om)

    @triton.jit
    def _biases(acc_g, acc_u, bg_ptr, bu_ptr, offs_n, N, HAS_BG: tl.constexpr, HAS_BU: tl.constexpr):
        if HAS_BG:
            acc_g += tl.load(bg_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        if HAS_BU:
            acc_u += tl.load(bu_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        return acc_g, acc_u

    @triton.jit
    def _silu_product_store(acc_g, acc_u, out_ptr, offs_m, offs_n, M, N, stride_om):
        """out[offs_m, offs_n] = silu(gate) * up from the float32 accumulators (biases in), masked to M x N."""
        dt = out_ptr.dtype.element_ty
        # The module path's rounding points: gate_proj and up_proj outputs, silu(gate), then the product.
        g = acc_g.to(dt).to(tl.float32)
        u = acc_u.to(dt).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptrs, (act * u).to(dt), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
