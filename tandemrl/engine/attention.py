"""Paged attention: writing K/V into the block cache, and attending over it for prefill and for decode.

Cache layout (one pair per layer): ``k_cache``, ``v_cache`` of shape [num_blocks, block_size, kv_heads, head_dim];
token t of a sequence lives in slot ``block_table[t // block_size] * block_size + t % block_size``.

Both paths read K/V back from the cache (after ``store_kv`` wrote this step's tokens), so prefix-cache hits and
freshly computed tokens are treated alike. GQA is handled without repeating K/V: the query heads that share a
KV head are folded into the query-length dimension of one SDPA call (HF's ``repeat_kv`` maps KV head h to query
heads h*G .. h*G+G-1, which is the order ``view(kv_heads, G)`` gives).

Sliding windows follow Hugging Face's mask: a query at position p sees keys at positions j with p - window < j <= p.
Decode is CUDA-graph capturable: fixed shapes for a given (batch, block-table width), no host syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # optional: the fused paged decode kernel (CUDA only); the SDPA path is the fallback and the reference
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install: the SDPA path serves
    triton = None

# Bound on one prefill SDPA call's padded mask (sequences x Q*G queries x L keys); larger batches go in chunks.
_PREFILL_MASK_ELEMENTS = 1 << 26


@dataclass
class PrefillMeta:
    """A packed prefill of S sequences, N new tokens in all, padded to Q query rows per sequence inside attention."""

    positions: Tensor  # [N] long: absolute position of each new token
    slot_mapping: Tensor  # [N] long: cache slot each new token's K/V is written to
    block_tables: Tensor  # [S, W] long: physical blocks of each sequence (padding rows/columns hold valid ids)
    query_rows: Tensor  # [S, Q] long: packed row of each padded query (0 on padding)
    query_pos: Tensor  # [S, Q] long: absolute position of each padded query (0 on padding)
    unpad_index: Tensor  # [N] long: flat index s * Q + i of each packed token in the padded layout
    last_rows: Tensor  # [S] long: packed row of each sequence's last token (the one we sample from)


@dataclass
class DecodeMeta:
    """One query token for each of B sequences."""

    positions: Tensor  # [B] long
    slot_mapping: Tensor  # [B] long
    block_tables: Tensor  # [B, W] long
    context_lens: Tensor  # [B] long: tokens in each context, the new one included (= position + 1)
    use_triton: bool = False
    opaque_attention: bool = False  # hide the attention call from torch.compile (see compile.py)


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write k, v [N, kv_heads, head_dim] into the flattened caches at slot_mapping [N]."""
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv(cache: Tensor, block_tables: Tensor) -> Tensor:
    """[B, W] block ids -> [B, kv_heads, W * block_size, head_dim]: each row's context in token order."""
    B, W = block_tables.shape
    _, block_size, kv_heads, head_dim = cache.shape
    return cache[block_tables].view(B, W * block_size, kv_heads, head_dim).transpose(1, 2)


def build_prefill_meta(
    query_lens: list[int], context_lens: list[int], block_tables: Tensor, block_size: int, device: torch.device
) -> PrefillMeta:
    """Metadata for sequences that each compute their last query_lens[s] tokens of a context_lens[s]-token context.

    Index arithmetic runs on the host (prefill is eager; these are small integer tensors), then moves once.
    """
    S, Q = len(query_lens), max(query_lens)
    qlens = torch.tensor(query_lens, dtype=torch.long)
    clens = torch.tensor(context_lens, dtype=torch.long)
    if bool((qlens < 1).any()) or bool((qlens > clens).any()):
        raise ValueError(f"each sequence needs 1 <= query_len <= context_len, got {query_lens} / {context_lens}")
    starts = qlens.cumsum(0) - qlens
    i = torch.arange(Q).unsqueeze(0)
    valid = i < qlens.unsqueeze(1)
    pos = clens.unsqueeze(1) - qlens.unsqueeze(1) + i
    positions = pos[valid]
    seq_of_token = torch.arange(S).unsqueeze(1).expand(S, Q)[valid]
    tables = block_tables.cpu()
    slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    meta = PrefillMeta(
        positions=positions,
        slot_mapping=slots,
        block_tables=tables,
        query_rows=torch.where(valid, starts.unsqueeze(1) + i, 0),
        query_pos=torch.where(valid, pos, 0),
        unpad_index=(torch.arange(S).unsqueeze(1) * Q + i)[valid],
        last_rows=starts + qlens - 1,
    )
    return PrefillMeta(**{name: t.to(device, non_blocking=True) for name, t in vars(meta).items()})


def prefill_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PrefillMeta, scale: float, window: int | None
) -> Tensor:
    """q [N, H, D] (packed new tokens) -> [N, H, D], causal over each sequence's whole cached context.

    Sequences are padded to Q queries and W blocks and attended in chunks of sequences, so the padded mask of one
    SDPA call stays under _PREFILL_MASK_ELEMENTS whatever the batch.
    """
    N, H, D = q.shape
    S, Q = meta.query_rows.shape
    G = H // k_cache.shape[2]
    L = meta.block_tables.shape[1] * k_cache.shape[1]
    step = max(1, _PREFILL_MASK_ELEMENTS // (Q * G * L))
    parts = [_prefill_chunk(q, k_cache, v_cache, meta, slice(c, c + step), scale, window) for c in range(0, S, step)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.view(S * Q, H, D)[meta.unpad_index]


def _prefill_chunk(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PrefillMeta, seqs: slice, scale: float, window: int | None
) -> Tensor:
    """Attention for the sequences `seqs` of the batch: [s, Q, H, D] in the padded layout."""
    _, H, D = q.shape
    rows, qpos = meta.query_rows[seqs], meta.query_pos[seqs]
    S, Q = rows.shape
    kv_heads = k_cache.shape[2]
    G = H // kv_heads
    k = gather_kv(k_cache, meta.block_tables[seqs])  # [S, kvh, L, D]
    v = gather_kv(v_cache, meta.block_tables[seqs])
    # Queries padded to [S, Q, kvh, G, D], then the G heads of a KV head folded next to Q: [S, kvh, Q*G, D].
    qp = q[rows].view(S, Q, kv_heads, G, D).permute(0, 2, 1, 3, 4).reshape(S, kv_heads, Q * G, D)
    keys = torch.arange(k.shape[2], device=q.device)
    qpos = qpos.unsqueeze(-1)  # [S, Q, 1]
    mask = keys <= qpos
    if window is not None:
        mask &= keys > qpos - window
    mask = mask.repeat_interleave(G, dim=1).unsqueeze(1)  # [S, 1, Q*G, L], rows in (Q, G) order like qp
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale)  # [S, kvh, Q*G, D]
    return out.view(S, kv_heads, Q, G, D).permute(0, 2, 1, 3, 4).reshape(S, Q, H, D)


def decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: DecodeMeta, scale: float, window: int | None
) -> Tensor:
    """q [B, H, D] (one token per sequence, at position context_len - 1) -> [B, H, D]."""
    if meta.opaque_attention:
        return _opaque_decode_attention(q, k_cache, v_cache, meta, scale, window)
    return _decode_attention(q, k_cache, v_cache, meta, scale, window)


def _decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: DecodeMeta, scale: float, window: int | None
) -> Tensor:
    if meta.use_triton:
        return triton_paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, window)
    return sdpa_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, window)


# torch.compile runs this eagerly (a graph break) when it cannot trace the Triton launcher.
_opaque_decode_attention = torch.compiler.disable(_decode_attention)


def sdpa_decode(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, context_lens: Tensor, scale: float,
    window: int | None,
) -> Tensor:
    """Reference decode: gather the padded contexts, mask positions >= context_len, one SDPA call."""
    B, H, D = q.shape
    kv_heads = k_cache.shape[2]
    G = H // kv_heads
    k = gather_kv(k_cache, block_tables)  # [B, kvh, L, D]
    v = gather_kv(v_cache, block_tables)
    keys = torch.arange(k.shape[2], device=q.device)
    ctx = context_lens.unsqueeze(-1)  # [B, 1]
    mask = keys < ctx
    if window is not None:
        mask &= keys >= ctx - window  # p - window < j with p = ctx - 1
    out = F.scaled_dot_product_attention(q.view(B, kv_heads, G, D), k, v, attn_mask=mask[:, None, None, :],
                                         scale=scale)
    return out.reshape(B, H, D)


def triton_decode_available(device: torch.device) -> bool:
    """Whether the fused decode kernel can run here: Triton importable and a CUDA device."""
    return triton is not None and torch.device(device).type == "cuda"


def triton_paged_decode(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, context_lens: Tensor, scale: float,
    window: int | None,
) -> Tensor:
    """Same contract as sdpa_decode, fused: one program per (sequence, KV head) walks that sequence's blocks
    with an online softmax, reading only the first context_len tokens (not the padded width)."""
    if triton is None:
        raise RuntimeError("triton_paged_decode needs the triton package")
    B, H, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = H // kv_heads
    # The kernel indexes context_lens with unit stride; block tables may be strided (CUDA graphs stage them
    # column-major).
    q, context_lens = q.contiguous(), context_lens.contiguous()
    out = torch.empty_like(q)
    _paged_decode_kernel[(B, kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens, out,
        scale, window if window is not None else 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_N=64,
        HAS_WINDOW=window is not None, IEEE=q.dtype == torch.float32,
    )
    return out


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr,
        scale, window,
        stride_qb, stride_qh,
        stride_kblk, stride_kslot, stride_kh,
        stride_btb, stride_btn,
        stride_ob, stride_oh,
        BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gd_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
        heads = kvh * GROUP + g
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gd_mask, other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        start = 0
        if HAS_WINDOW:
            start = tl.maximum(ctx - window, 0)
        for n0 in range(start, ctx, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            t_mask = tok < ctx
            bt_off = b * stride_btb + (tok // BLOCK_SIZE) * stride_btn
            blk = tl.load(bt_ptr + bt_off, mask=t_mask, other=0).to(tl.int64)
            off = blk * stride_kblk + (tok % BLOCK_SIZE) * stride_kslot + kvh * stride_kh
            nd_mask = t_mask[:, None] & (d < HEAD_DIM)[None, :]
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=nd_mask, other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(t_mask[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + off[:, None] + d[None, :], mask=nd_mask, other=0.0)
            if IEEE:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new
        out = acc / l[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gd_mask)
