"""Fused Triton kernels for the decoder's elementwise work, each with the pure-torch reference it must match.

A decode step is hundreds of tiny kernels; these fold HF's op chains into one launch each:

- ``add_rmsnorm``: the residual add of the previous sublayer and the next RMSNorm (HF Qwen2RMSNorm/LlamaRMSNorm
  order: float32 variance and scaling, cast to the input dtype, then times the weight, in the promoted dtype).
- ``rope_qk_``: HF's rotate-half RoPE on q and k in place, one launch for both.
- ``rope_qk_store_``: the same, plus the rotated k and v written into the paged K/V cache (``store_kv``'s job).
- ``silu_mul``: act(gate) * up of a SiLU MLP (the projections stay module calls, so LoRA wrappers work).

Rounding is emulated step by step: every HF op in a 16-bit dtype computes in float32 and rounds its result, so
the kernels round at the same points (e.g. RoPE rounds x*cos and rotate_half(x)*sin before adding them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tandemrl.engine.kernels import pdl
from tandemrl.engine.kernels.paged_kv import FP8_E4M3_MAX, store_kv

try:  # optional: without Triton (or off CUDA) the forward keeps its plain torch ops
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install
    triton = None


def fused_available(device: torch.device | str) -> bool:
    """Whether the fused kernels can run here: Triton importable and a CUDA device."""
    return triton is not None and torch.device(device).type == "cuda"


def is_plain_rmsnorm(module: nn.Module) -> bool:
    """A HF RMSNorm with the plain ``weight * normed`` formula (not Gemma's ``1 + weight``) and no hooks."""
    name = type(module).__name__
    weight = getattr(module, "weight", None)
    return (name.endswith("RMSNorm") and "gemma" not in name.lower()
            and isinstance(weight, Tensor) and weight.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), (float, int))
            and not module._forward_hooks and not module._forward_pre_hooks)


def is_silu_mlp(mlp: nn.Module) -> bool:
    """A gated MLP computing down_proj(silu(gate_proj(x)) * up_proj(x)) (Qwen2/Qwen3/Llama/Mistral), no hooks."""
    act = getattr(mlp, "act_fn", None)
    silu = isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return (silu and type(mlp).__name__.endswith("MLP")
            and all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))
            and not mlp._forward_hooks and not mlp._forward_pre_hooks)


# ---------------------------------------------------------------------------------------------- references

def add_rmsnorm_ref(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + residual), x + residual), exactly as HF computes them; residual None means no add."""
    new_residual = x if residual is None else residual + x
    h = new_residual.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(new_residual.dtype), new_residual


def rope_qk_ref_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """HF's apply_rotary_pos_emb in place: q [N, Hq, D], k [N, Hkv, D], cos/sin [N, D] (one row per token)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for x in (q, k):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        x.copy_(x * cos + rotated * sin)
    return q, k


def silu_mul_ref(gate: Tensor, up: Tensor) -> Tensor:
    return torch.nn.functional.silu(gate) * up


# ---------------------------------------------------------------------------------------------- launchers

def add_rmsnorm(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Fused ``add_rmsnorm_ref`` over the last dim (one program per row). With residual None the new residual
    is ``x`` itself (nothing written). Returns (normed, new_residual)."""
    H = x.shape[-1]
    if weight.shape != (H,):
        raise ValueError(f"add_rmsnorm: weight shape {tuple(weight.shape)} does not match hidden size {H}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"add_rmsnorm: residual {tuple(residual.shape)}/{residual.dtype} does not match "
                         f"x {tuple(x.shape)}/{x.dtype}")
    x2 = x.reshape(-1, H)
    if x2.stride(-1) != 1 or (residual is not None and not residual.is_contiguous()):
        return add_rmsnorm_ref(x, residual, weight, eps)  # odd layouts: rare, take the exact torch path
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    new_residual = x if residual is None else torch.empty_like(x)
    if rows == 0:
        return out, new_residual
    res2 = x2 if residual is None else residual.reshape(-1, H)
    _add_rmsnorm_kernel[(rows,)](
        x2, res2, weight, out, new_residual, x2.stride(0), H, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK_H=triton.next_power_of_2(H), num_warps=_warps(H),
        **pdl.launch_options(x.device))
    return out, new_residual


def rope_qk_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Fused ``rope_qk_ref_``: rotates q [N, Hq, D] and k [N, Hkv, D] in place, one program per token."""
    N, Hq, D = q.shape
    Hk = k.shape[1]
    if D % 2 or k.shape[0] != N or k.shape[2] != D or cos.shape != (N, D) or sin.shape != (N, D):
        raise ValueError(f"rope_qk_: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, cos {tuple(cos.shape)}, "
                         f"sin {tuple(sin.shape)} do not fit [N, H, D] / [N, D] with D even")
    strided = any(t.stride(-1) != 1 for t in (q, k, cos, sin))
    if strided or N == 0 or len({q.dtype, k.dtype, cos.dtype, sin.dtype}) > 1:
        return rope_qk_ref_(q, k, cos, sin)  # HF casts cos/sin to q's dtype: mixed dtypes are not our case
    half = D // 2
    _rope_qk_kernel[(N,)](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        HQ=Hq, HK=Hk, HALF=half, BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HK=triton.next_power_of_2(Hk),
        BLOCK_HALF=triton.next_power_of_2(half), num_warps=4, **pdl.launch_options(q.device))
    return q, k


def rope_qk_store_(
    q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
    slot_mapping: Tensor,
) -> tuple[Tensor, Tensor]:
    """``rope_qk_`` then ``paged_kv.store_kv`` in one launch (one program per token): rotates q [N, Hq, D] and
    k [N, Hkv, D] in place (bit for bit as ``rope_qk_``) and writes token n's rotated k and its v [N, Hkv, D] to
    flat slot ``slot_mapping[n]`` (= block * block_size + offset) of k_cache / v_cache [blocks, block_size, Hkv, D],
    cast to the cache dtype (an fp8 cache saturating, as ``paged_kv.to_cache_dtype``). Slots must be valid; a slot named twice gets one of its tokens (as index_copy_)."""
    N, Hq, D = q.shape
    Hk = k.shape[1]
    if D % 2 or k.shape != (N, Hk, D) or v.shape != k.shape or cos.shape != (N, D) or sin.shape != (N, D) \
            or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (Hk, D) or slot_mapping.shape != (N,):
        raise ValueError(f"rope_qk_store_: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, cos "
                         f"{tuple(cos.shape)}, sin {tuple(sin.shape)}, caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}, slot_mapping {tuple(slot_mapping.shape)} do not fit [N, H, D] "
                         "rows with D even, [N, D] angles, [blocks, block_size, Hkv, D] caches and [N] slots")
    if not _rope_store_fits(q, k, v, cos, sin, k_cache, v_cache):
        rope_qk_(q, k, cos, sin)  # odd layouts or mixed dtypes: rare, the two separate exact ops
        store_kv(k, v, k_cache, v_cache, slot_mapping)
        return q, k
    half = D // 2
    _rope_qk_store_kernel[(N,)](
        q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        k_cache.stride(1), k_cache.stride(2), slot_mapping.stride(0),
        HQ=Hq, HK=Hk, HALF=half, BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HK=triton.next_power_of_2(Hk),
        BLOCK_HALF=triton.next_power_of_2(half), SATURATE=k_cache.dtype == torch.float8_e4m3fn, num_warps=4,
        **pdl.launch_options(q.device))
    return q, k


def _rope_store_fits(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor,
                     v_cache: Tensor) -> bool:
    """Whether the fused kernel takes these operands: tokens present, one activation dtype, unit-stride head dims,
    and caches whose (block, offset) dims flatten to one slot dim with the same strides for K and V."""
    if q.shape[0] == 0 or len({q.dtype, k.dtype, v.dtype, cos.dtype, sin.dtype}) > 1:
        return False
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, sin, k_cache)):
        return False
    return k_cache.stride() == v_cache.stride() and k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """Fused ``silu_mul_ref`` (silu rounded to gate's dtype before the product, as torch does)."""
    if gate.shape != up.shape or gate.dtype != up.dtype or not (gate.is_contiguous() and up.is_contiguous()):
        return silu_mul_ref(gate, up)
    out = torch.empty_like(gate)
    n = gate.numel()
    if n:
        block = 1024
        _silu_mul_kernel[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block, num_warps=4,
                                                    **pdl.launch_options(gate.device))
    return out


def _warps(h: int) -> int:
    return 1 if h <= 256 else 4 if h <= 2048 else 8


# ---------------------------------------------------------------------------------------------- kernels

if triton is not None:

    FP8_MAX = tl.constexpr(FP8_E4M3_MAX)

    @triton.jit
    def _add_rmsnorm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, stride_row, H, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl.pdl_enter(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * H + cols, mask=mask, other=0.0)
            x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)  # HF rounds the sum to the input dtype
            tl.store(new_res_ptr + row * H + cols, x, mask=mask)
        h = x.to(tl.float32)
        variance = tl.sum(h * h, axis=0) / H
        h = (h * tl.rsqrt(variance + eps)).to(x.dtype).to(tl.float32)  # cast back before the weight, as HF
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * H + cols, (w * h).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_angles(cos_ptr, sin_ptr, stride_cn, stride_sn, n, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
        d = tl.arange(0, BLOCK_HALF)[None, :]
        dmask = d < HALF
        # cos/sin over the full head dim (HF multiplies by all D entries; they need not repeat per half)
        c1 = tl.load(cos_ptr + n * stride_cn + d, mask=dmask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + n * stride_cn + HALF + d, mask=dmask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + n * stride_sn + d, mask=dmask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + n * stride_sn + HALF + d, mask=dmask, other=0.0).to(tl.float32)
        return c1, c2, s1, s2

    @triton.jit
    def _rope_one(
        ptr, stride_n, stride_h, c1, c2, s1, s2, n, H: tl.constexpr, HALF: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):
        heads = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_HALF)[None, :]
        mask = (heads < H) & (d < HALF)
        p1 = ptr + n * stride_n + heads * stride_h + d
        x1 = tl.load(p1, mask=mask, other=0.0)
        x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
        dt = x1.dtype
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        # x * cos + rotate_half(x) * sin, each product rounded to the input dtype before the add (as HF in bf16)
        o1 = (f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)
        o2 = (f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)
        o1, o2 = o1.to(dt), o2.to(dt)
        tl.store(p1, o1, mask=mask)
        tl.store(p1 + HALF, o2, mask=mask)
        return o1, o2  # the rotated halves [BLOCK_H, BLOCK_HALF] (rope_qk_store_ writes them to the cache)

    @triton.jit
    def _rope_qk_kernel(
        q_ptr, k_ptr, cos_ptr, sin_ptr, stride_qn, stride_qh, stride_kn, stride_kh, stride_cn, stride_sn,
        HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
        BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl.pdl_enter(PDL)
        n = tl.program_id(0).to(tl.int64)
        c1, c2, s1, s2 = _rope_angles(cos_ptr, sin_ptr, stride_cn, stride_sn, n, HALF, BLOCK_HALF)
        _rope_one(q_ptr, stride_qn, stride_qh, c1, c2, s1, s2, n, HQ, HALF, BLOCK_HQ, BLOCK_HALF)
        _rope_one(k_ptr, stride_kn, stride_kh, c1, c2, s1, s2, n, HK, HALF, BLOCK_HK, BLOCK_HALF)

    @triton.jit
    def _rope_qk_store_kernel(
        q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr,
        stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_cn, stride_sn,
        stride_cslot, stride_chead, stride_slot,
        HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
        BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, SATURATE: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # _rope_qk_kernel's work (the same code, so the same bits), then token n's rotated k and its v rows
        # copied to cache slot slot_mapping[n].
        pdl.pdl_enter(PDL)
        n = tl.program_id(0).to(tl.int64)
        c1, c2, s1, s2 = _rope_angles(cos_ptr, sin_ptr, stride_cn, stride_sn, n, HALF, BLOCK_HALF)
        _rope_one(q_ptr, stride_qn, stride_qh, c1, c2, s1, s2, n, HQ, HALF, BLOCK_HQ, BLOCK_HALF)
        k1, k2 = _rope_one(k_ptr, stride_kn, stride_kh, c1, c2, s1, s2, n, HK, HALF, BLOCK_HK, BLOCK_HALF)
        d = tl.arange(0, BLOCK_HALF)[None, :]
        heads = tl.arange(0, BLOCK_HK)[:, None]
        mask = (heads < HK) & (d < HALF)
        slot = tl.load(slot_ptr + n * stride_slot).to(tl.int64)
        dst = slot * stride_cslot + heads * stride_chead + d
        tl.store(kc_ptr + dst, _cache_value(k1, kc_ptr, SATURATE), mask=mask)
        tl.store(kc_ptr + dst + HALF, _cache_value(k2, kc_ptr, SATURATE), mask=mask)
        src = v_ptr + n * stride_vn + heads * stride_vh + d
        v1 = tl.load(src, mask=mask, other=0.0)
        v2 = tl.load(src + HALF, mask=mask, other=0.0)
        tl.store(vc_ptr + dst, _cache_value(v1, vc_ptr, SATURATE), mask=mask)
        tl.store(vc_ptr + dst + HALF, _cache_value(v2, vc_ptr, SATURATE), mask=mask)

    @triton.jit
    def _cache_value(x, cache_ptr, SATURATE: tl.constexpr):
        """x in the cache's dtype; SATURATE (an fp8 cache): clamped to its finite range first, as ``to_cache_dtype``."""
        if SATURATE:
            x = tl.minimum(tl.maximum(x.to(tl.float32), -FP8_MAX), FP8_MAX)
        return x.to(cache_ptr.dtype.element_ty)

    @triton.jit
    def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl.pdl_enter(PDL)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0)
        u = tl.load(up_ptr + offs, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # torch's silu, rounded to the input dtype
        tl.store(out_ptr + offs, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=mask)
