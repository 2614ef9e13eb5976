"""Paged attention: writing K/V into the block cache, and attending over it for prefill and for decode.

Cache layout (one pair per layer): ``k_cache``, ``v_cache`` of shape [num_blocks, block_size, kv_heads, head_dim];
token t of a sequence lives in slot ``block_table[t // block_size] * block_size + t % block_size``.

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

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tandemrl.engine.pending import copy_to_device
from tandemrl.engine.triton_attention import triton_paged_decode, triton_paged_prefill

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
    query_lens: Tensor  # [S] long: new tokens of each sequence (they are its last ones)
    context_lens: Tensor  # [S] long: tokens in each context, the new ones included
    use_triton: bool = False  # attend with the Triton paged-prefill kernel instead of the padded SDPA calls


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
    query_lens: list[int], context_lens: list[int], block_tables: Tensor, block_size: int, device: torch.device,
    use_triton: bool = False,
) -> PrefillMeta:
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
    return PrefillMeta(**{name: v.view(a.shape) for (name, a), v in zip(host.items(), views)},
                       use_triton=use_triton)


def prefill_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PrefillMeta, scale: float, window: int | None
) -> Tensor:
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
