"""Paged attention: writing K/V into the block cache, and attending over it for prefill and for decode.

The cache layout, the metadata types and ``store_kv`` live in kernels/paged_kv.py (the kernels read them too).
Both paths read K/V back from the cache (after ``store_kv`` wrote this step's tokens), so prefix-cache hits and
freshly computed tokens are treated alike. GQA is handled without repeating K/V: the query heads that share a
KV head are folded into the query-length dimension of one SDPA call (HF's ``repeat_kv`` maps KV head h to query
heads h*G .. h*G+G-1, which is the order ``view(kv_heads, G)`` gives).

Sliding windows follow Hugging Face's mask: a query at position p sees keys at positions j with p - window < j <= p.
Decode is CUDA-graph capturable: fixed shapes for a given (batch, block-table width), no host syncs.
The SDPA paths here are the reference and the fallback; on CUDA the runner attends with the Triton kernels of
triton_attention.py (``use_triton`` on the metadata).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tandemrl.engine.kernels.paged_kv import DecodeMeta, PrefillMeta
from tandemrl.engine.kernels.triton_attention import triton_paged_decode, triton_paged_prefill
from tandemrl.engine.model.pending import copy_to_device

# Bound on one prefill SDPA call's padded mask (sequences x Q*G queries x L keys); larger batches go in chunks.
_PREFILL_MASK_ELEMENTS = 1 << 26


def query_groups(row_of: np.ndarray, capacity: int) -> np.ndarray:
    """For rows whose sequences ``row_of`` [B] (one id per sequence) run side by side: the size of each group of at
    most ``capacity`` rows of one run at its first row, 0 at the others (rows a group's program serves)."""
    starts = np.flatnonzero(np.r_[True, row_of[1:] != row_of[:-1]])
    lengths = np.diff(np.r_[starts, len(row_of)])
    run = np.repeat(np.arange(len(starts)), lengths)
    offset = np.arange(len(row_of)) - starts[run]
    left = lengths[run] - offset  # rows of the run from this one on
    return np.where(offset % capacity == 0, np.minimum(capacity, left), 0).astype(np.int64)


def gather_kv(cache: Tensor, block_tables: Tensor) -> Tensor:
    """[B, W] block ids -> [B, kv_heads, W * block_size, head_dim]: each row's context in token order."""
    B, W = block_tables.shape
    _, block_size, kv_heads, head_dim = cache.shape
    return cache[block_tables].view(B, W * block_size, kv_heads, head_dim).transpose(1, 2)


def build_prefill_meta(query_lens: list[int], context_lens: list[int], block_tables: Tensor, block_size: int,
                       device: torch.device, use_triton: bool = False) -> PrefillMeta:
    """Metadata for sequences that each compute their last query_lens[s] tokens of a context_lens[s]-token context.

    Index arithmetic runs on the host in numpy (prefill is eager; these are small integer arrays), then every
    array moves to the device in one copy: torch's CPU ops and seven pageable copies cost ~10 ms per 16k-token
    prefill on an H100 host, time the GPU sat idle.
    """
    S, Q = len(query_lens), max(query_lens)
    qlens = np.asarray(query_lens, dtype=np.int64)
    clens = np.asarray(context_lens, dtype=np.int64)
    if (qlens < 1).any() or (qlens > clens).any():
        raise ValueError(f"each sequence needs 1 <= query_len <= context_len, got {query_lens} / {context_lens}")
    starts = np.cumsum(qlens) - qlens
    i = np.arange(Q)
    valid = i < qlens[:, None]
    pos = (clens - qlens)[:, None] + i
    positions = pos[valid]
    tables = block_tables.cpu().numpy().astype(np.int64, copy=False)
    slots = tables[np.repeat(np.arange(S), qlens), positions // block_size] * block_size + positions % block_size
    host = {
        "positions": positions,
        "slot_mapping": slots,
        "block_tables": tables,
        "query_rows": np.where(valid, starts[:, None] + i, 0),
        "query_pos": np.where(valid, pos, 0),
        "unpad_index": (np.arange(S)[:, None] * Q + i)[valid],
        "last_rows": starts + qlens - 1,
        "query_lens": qlens,
        "context_lens": clens,
    }
    flat = copy_to_device(torch.from_numpy(np.concatenate([a.ravel() for a in host.values()])), device)
    views = flat.split([a.size for a in host.values()])
    return PrefillMeta(**{name: v.view(a.shape) for (name, a), v in zip(host.items(), views)}, use_triton=use_triton)


def prefill_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PrefillMeta, scale: float,
                      window: int | None) -> Tensor:
    """q [N, H, D] (packed new tokens) -> [N, H, D], causal over each sequence's whole cached context.

    With ``meta.use_triton`` one Triton launch (`triton_paged_prefill`). Else sequences are padded to Q queries
    and W blocks and attended in chunks of sequences, so the padded mask of one SDPA call stays under
    _PREFILL_MASK_ELEMENTS whatever the batch.
    """
    if meta.use_triton:
        return triton_paged_prefill(q, k_cache, v_cache, meta, scale, window)
    N, H, D = q.shape
    S, Q = meta.query_rows.shape
    G = H // k_cache.shape[2]
    L = meta.block_tables.shape[1] * k_cache.shape[1]
    step = max(1, _PREFILL_MASK_ELEMENTS // (Q * G * L))
    parts = [_prefill_chunk(q, k_cache, v_cache, meta, slice(c, c + step), scale, window) for c in range(0, S, step)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.view(S * Q, H, D)[meta.unpad_index]


def _prefill_chunk(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PrefillMeta, seqs: slice, scale: float,
                   window: int | None) -> Tensor:
    """Attention for the sequences `seqs` of the batch: [s, Q, H, D] in the padded layout."""
    _, H, D = q.shape
    rows, qpos = meta.query_rows[seqs], meta.query_pos[seqs]
    S, Q = rows.shape
    kv_heads = k_cache.shape[2]
    G = H // kv_heads
    k = gather_kv(k_cache, meta.block_tables[seqs]).to(q.dtype)  # [S, kvh, L, D]; fp8 dequantised (scale 1.0)
    v = gather_kv(v_cache, meta.block_tables[seqs]).to(q.dtype)
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


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: DecodeMeta, scale: float,
                     window: int | None) -> Tensor:
    """q [B, H, D] (one token per sequence, at position context_len - 1) -> [B, H, D]."""
    if meta.use_triton:
        return triton_paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, window,
                                   query_groups=meta.query_groups)
    return sdpa_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, window)


def sdpa_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, context_lens: Tensor, scale: float,
                window: int | None) -> Tensor:
    """Reference decode: gather the padded contexts, mask positions >= context_len, one SDPA call."""
    B, H, D = q.shape
    kv_heads = k_cache.shape[2]
    G = H // kv_heads
    k = gather_kv(k_cache, block_tables).to(q.dtype)  # [B, kvh, L, D]; an fp8 cache dequantised (scale 1.0)
    v = gather_kv(v_cache, block_tables).to(q.dtype)
    keys = torch.arange(k.shape[2], device=q.device)
    ctx = context_lens.unsqueeze(-1)  # [B, 1]
    mask = keys < ctx
    if window is not None:
        mask &= keys >= ctx - window  # p - window < j with p = ctx - 1
    out = F.scaled_dot_product_attention(q.view(B, kv_heads, G, D), k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return out.reshape(B, H, D)
