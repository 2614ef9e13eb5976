"""The Triton paged-attention kernels (CUDA, or Triton's CPU interpreter in tests): decode (one query per sequence,
optionally split-K, "flash-decoding") and prefill (causal over each sequence's cached context). Both read K/V
through the block tables of attention.py's cache layout and match its SDPA reference paths; see attention.py for
the layout, the GQA folding and the sliding-window rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandemrl.engine.kernels import pdl
from tandemrl.engine.kernels.attention_tiles import (DEFAULT_DECODE_TILES, MAX_SPLITS, DecodeAttentionTiles,
                                                     decode_rows, decode_splits, device_sm_count, few_programs,
                                                     kv_tile_tokens, split_min_tokens)
from tandemrl.engine.kernels.paged_kv import PrefillMeta

try:  # optional: without Triton the SDPA paths of attention.py serve
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install
    triton = None

# Triton paged prefill: rows of a program (queries x the query heads of one KV head) and keys per inner step.
_PREFILL_BLOCK_M = 128
_PREFILL_BLOCK_N = 64
_PREFILL_WARPS = 8
_LOG2E = 1.4426950408889634  # the kernels use exp2 with log2(e) folded into the softmax scale


def triton_decode_available(device: torch.device) -> bool:
    """Whether the fused decode kernel can run here: Triton importable and a CUDA device."""
    return triton is not None and torch.device(device).type == "cuda"


def triton_paged_decode(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, context_lens: Tensor, scale: float,
    window: int | None, *, num_splits: int | None = None, tiles: DecodeAttentionTiles = DEFAULT_DECODE_TILES,
    query_groups: Tensor | None = None,
) -> Tensor:
    """Same contract as sdpa_decode, fused: reads only each row's first context_len tokens (not the padded width).

    query_groups [B] (optional): rows of one sequence side by side (a verify step, a tandem forward) attend in one
    program that reads their K/V once: a group's first row holds the group's size (at most
    ``decode_query_capacity``), the others 0; the rows of a group must share one block table. Single pass only.

    Split-K ("flash-decoding"): each (row, KV head) context is cut into `num_splits` partitions, attended by
    separate programs into a float32 workspace, then merged by a small second kernel. None picks the count from
    host-known shapes only (`decode_splits`), so a CUDA graph captured per (rows, width) stays valid for any
    context_lens; one split runs the single-pass kernel, no workspace, no merge. `tiles`: the launch choices (the
    engine keeps the defaults; benchmarks sweep them).
    """
    if triton is None:
        raise RuntimeError("triton_paged_decode needs the triton package")
    B, H, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if H % kv_heads or k_cache.shape[-1] != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"triton_paged_decode: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)} (query heads must be a multiple of the KV heads)")
    if block_tables.shape[0] != B or context_lens.shape != (B,):
        raise ValueError(f"triton_paged_decode: block_tables {tuple(block_tables.shape)} / context_lens "
                         f"{tuple(context_lens.shape)} do not have {B} rows")
    if query_groups is not None:
        num_splits = 1  # a group's queries end at different positions: the split-K merge assumes one context
    if num_splits is None:
        sms = device_sm_count(q.device)
        num_splits = decode_splits(B, kv_heads, block_tables.shape[1], block_size, sms, tiles=tiles)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"triton_paged_decode: num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("triton_paged_decode: the K and V caches need the same strides and a unit last stride")
    # Every operand is read through its strides (block tables staged column-major by CUDA graphs, q as a view of
    # a fused projection); only head_dim must be unit-stride.
    if q.stride(-1) != 1:
        q = q.contiguous()
    group = H // kv_heads
    out = torch.empty(B, H, D, dtype=q.dtype, device=q.device)
    single = num_splits == 1
    # Long partitions (rows x KV heads fill half the SMs) stream like the single pass: its larger tiles.
    long_tiles = single or not few_programs(B * kv_heads, device_sm_count(q.device))
    block_n = kv_tile_tokens(tiles.single_pass_block_n if long_tiles else tiles.block_n, D, k_cache.element_size())
    common = dict(BLOCK_SIZE=block_size, GROUP=group, BLOCK_G=decode_rows(group), HEAD_DIM=D,
                  BLOCK_D=max(16, triton.next_power_of_2(D)), HAS_WINDOW=window is not None,
                  BLOCK_N=block_n, IEEE=q.dtype == torch.float32, num_warps=tiles.num_warps,
                  num_stages=tiles.single_pass_stages if long_tiles else tiles.stages)
    min_chunk = max(block_n, split_min_tokens(B * kv_heads, device_sm_count(q.device), tiles))
    if single:
        part_acc = part_m = part_l = out  # unused by the single-pass variant
    else:
        part_acc = torch.empty(B, H, num_splits, D, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(2, B, H, num_splits, dtype=torch.float32, device=q.device)
        part_m, part_l = part_ml[0], part_ml[1]
    _paged_decode_kernel[(B, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_acc, part_m, part_l,
        context_lens if query_groups is None else query_groups,
        scale * _LOG2E, window if window is not None else 0, num_splits, min_chunk,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), block_tables.stride(1), context_lens.stride(0),
        out.stride(0), out.stride(1),
        SPLIT=not single, GROUPED=query_groups is not None, **common, **pdl.launch_options(q.device),
    )
    if not single:
        _combine_splits_kernel[(B, H)](
            part_acc, part_m, part_l, context_lens, out,
            window if window is not None else 0, num_splits, min_chunk, context_lens.stride(0), out.stride(0),
            out.stride(1), HEAD_DIM=D, BLOCK_D=common["BLOCK_D"], BLOCK_N=block_n, HAS_WINDOW=window is not None,
            BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4, **pdl.launch_options(q.device),
        )
    return out


def triton_paged_prefill(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PrefillMeta, scale: float, window: int | None,
) -> Tensor:
    """`prefill_attention`'s result in one launch (flash attention over the paged cache, FlashAttention-2 style):
    a program takes a tile of one sequence's queries for one KV head, the GROUP query heads sharing that head
    folded into its rows, and streams the keys it may see (causal, windowed) through the block table. Nothing is
    padded or gathered on the host side of the call; the SDPA path needed a dozen ops per layer for that."""
    if triton is None:
        raise RuntimeError("triton_paged_prefill needs the triton package")
    N, H, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if H % kv_heads or k_cache.shape[-1] != D or v_cache.shape != k_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"triton_paged_prefill: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    group = H // kv_heads
    block_m = _PREFILL_BLOCK_M if group <= _PREFILL_BLOCK_M // 2 else triton.next_power_of_2(2 * group)
    queries_per_tile = block_m // group
    S, Q = meta.query_rows.shape
    out = torch.empty(N, H, D, dtype=q.dtype, device=q.device)
    if N == 0:
        return out
    tables = meta.block_tables
    _paged_prefill_kernel[(S, triton.cdiv(Q, queries_per_tile), kv_heads)](
        q, k_cache, v_cache, tables, meta.last_rows, meta.query_lens, meta.context_lens, out,
        scale * _LOG2E, window if window is not None else 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        tables.stride(0), tables.stride(1), out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, GROUP=group, QUERIES=queries_per_tile, BLOCK_M=block_m, HEAD_DIM=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_N=_PREFILL_BLOCK_N, HAS_WINDOW=window is not None,
        IEEE=q.dtype == torch.float32, num_warps=_PREFILL_WARPS, **pdl.launch_options(q.device))
    return out


if triton is not None:

    @triton.jit
    def _split_chunk(ctx, window, num_splits, min_chunk, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
        # A row's first attended token, the tokens of each of its partitions (whole BLOCK_N tiles, at least
        # min_chunk) and how many partitions hold tokens, from its context length on the device: partition i
        # holds [start + i * chunk, min(start + (i+1) * chunk, ctx)).
        start = 0
        if HAS_WINDOW:
            start = tl.maximum(ctx - window, 0)
        per_split = tl.maximum(tl.cdiv(ctx - start, num_splits), min_chunk)
        chunk = tl.cdiv(per_split, BLOCK_N) * BLOCK_N
        return start, chunk, tl.cdiv(ctx - start, chunk)

    @triton.jit
    def _kv_tile(k_ptr, v_ptr, table_ptr, stride_btn, tok, t_mask, kvh, d, d_mask, stride_kblk, stride_kslot,
                 stride_kh, BLOCK_SIZE: tl.constexpr):
        """K and V [tokens, BLOCK_D] of one KV head at the positions `tok` of the sequence whose block-table row
        starts at table_ptr; zeros where t_mask is off. V is loaded with K, before the softmax needs it: both
        tiles are in flight at once."""
        blk = tl.load(table_ptr + (tok // BLOCK_SIZE) * stride_btn, mask=t_mask, other=0).to(tl.int64)
        off = blk * stride_kblk + (tok % BLOCK_SIZE) * stride_kslot + kvh * stride_kh
        nd_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + off[:, None] + d[None, :], mask=nd_mask, other=0.0)
        v = tl.load(v_ptr + off[:, None] + d[None, :], mask=nd_mask, other=0.0)
        return k, v

    @triton.jit
    def _softmax_step(q, k, v, seen, m, l, acc, qk_scale, IEEE: tl.constexpr):
        """One tile of keys into the online softmax of the rows of q (running max m, sum l, output acc); `seen`
        [rows or 1, keys] masks the scores. A row that has seen no key yet keeps weight 0 instead of NaN."""
        k = k.to(q.dtype)  # an fp8 cache is dequantised here (scale 1.0); a no-op otherwise
        v = v.to(q.dtype)
        if IEEE:  # float32 inputs: no TF32, to match torch's float32 attention
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(seen, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        return m_new, l, acc * alpha[:, None] + pv

    @triton.jit
    def _attend_keys(
        q, k_ptr, v_ptr, table_ptr, stride_btn, kvh, d, d_mask, lo, hi, pos, window, qk_scale,
        stride_kblk, stride_kslot, stride_kh, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr,
    ):
        """The online softmax of the ROWS rows of q over keys lo .. hi-1 of one sequence and KV head, BLOCK_N at a
        time: (running max, sum of weights, unnormalised output). CAUSAL: row r sees key j only if j <= pos[r]
        (and pos[r] - window < j with HAS_WINDOW); else every key of the range (decode: the range is the window)."""
        m = tl.full([ROWS], float("-inf"), tl.float32)
        l = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            t_mask = tok < hi
            k, v = _kv_tile(k_ptr, v_ptr, table_ptr, stride_btn, tok, t_mask, kvh, d, d_mask,
                            stride_kblk, stride_kslot, stride_kh, BLOCK_SIZE)
            if CAUSAL:
                seen = tok[None, :] <= pos[:, None]
                if HAS_WINDOW:
                    seen &= tok[None, :] > pos[:, None] - window
            else:
                seen = t_mask[None, :]
            m, l, acc = _softmax_step(q, k, v, seen, m, l, acc, qk_scale, IEEE)
        return m, l, acc

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, groups_ptr,
        qk_scale, window, num_splits, min_chunk,
        stride_qb, stride_qh,
        stride_kblk, stride_kslot, stride_kh,
        stride_btb, stride_btn, stride_ctx,
        stride_ob, stride_oh,
        BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, GROUPED: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # One program per (row, KV head, partition): an online softmax over the partition's tokens for the GROUP
        # query heads sharing the KV head. qk_scale carries log2(e): exp2 throughout.
        pdl.pdl_enter(PDL)
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        if GROUPED:
            _grouped_decode(q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, groups_ptr, b, kvh, qk_scale, window,
                            stride_qb, stride_qh, stride_kblk, stride_kslot, stride_kh, stride_btb, stride_btn,
                            stride_ctx, stride_ob, stride_oh, BLOCK_SIZE, GROUP, BLOCK_G, HEAD_DIM, BLOCK_D,
                            BLOCK_N, HAS_WINDOW, IEEE)
        else:
            split = tl.program_id(2)
            ctx = tl.load(ctx_ptr + b * stride_ctx).to(tl.int32)
            start, chunk, active = _split_chunk(ctx, window, num_splits, min_chunk, HAS_WINDOW, BLOCK_N)
            lo = start + split * chunk
            hi = tl.minimum(lo + chunk, ctx)  # lo >= hi: a partition past a short row's context, nothing to do
            g = tl.arange(0, BLOCK_G)
            d = tl.arange(0, BLOCK_D)
            d_mask = d < HEAD_DIM
            gd_mask = (g < GROUP)[:, None] & d_mask[None, :] & (lo < hi)
            heads = kvh * GROUP + g
            q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gd_mask, other=0.0)
            m, l, acc = _attend_keys(
                q, k_ptr, v_ptr, bt_ptr + b * stride_btb, stride_btn, kvh, d, d_mask, lo, hi, hi, window, qk_scale,
                stride_kblk, stride_kslot, stride_kh, BLOCK_G, BLOCK_D, BLOCK_N, BLOCK_SIZE, False, False, IEEE)
            out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
            if SPLIT:
                if active > 1:
                    # Unnormalised partials [B, H, splits(, D)]; an empty partition writes nothing (the merge
                    # skips it).
                    part = (b * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
                    g_ok = (g < GROUP) & (lo < hi)
                    tl.store(part_m_ptr + part, m, mask=g_ok)
                    tl.store(part_l_ptr + part, l, mask=g_ok)
                    tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=gd_mask)
                else:  # the whole context in partition 0: no merge
                    tl.store(out_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=gd_mask)
            else:
                tl.store(out_ptrs, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=gd_mask)

    @triton.jit
    def _grouped_decode(
        q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, groups_ptr, b, kvh, qk_scale, window,
        stride_qb, stride_qh, stride_kblk, stride_kslot, stride_kh, stride_btb, stride_btn, stride_ctx,
        stride_ob, stride_oh, BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        # Rows b .. b + n - 1 (one sequence, n = groups[b]; 0: a row another program serves) in one program: tile
        # row r is query r // GROUP, head r % GROUP of the KV head; each query sees keys up to its own position,
        # and the K/V tiles are read once for all of them.
        n = tl.load(groups_ptr + b).to(tl.int32)
        if n > 0:
            r = tl.arange(0, BLOCK_G)
            i = r // GROUP
            valid = (i < n) & (r < (BLOCK_G // GROUP) * GROUP)
            rows = (b + tl.where(valid, i, 0)).to(tl.int64)
            ctx = tl.load(ctx_ptr + rows * stride_ctx, mask=valid, other=0).to(tl.int32)
            pos = tl.where(valid, ctx - 1, -1)  # a padding tile row sees no key
            hi = tl.max(ctx, axis=0)
            lo = 0
            if HAS_WINDOW:
                lo = tl.maximum(tl.min(tl.where(valid, ctx, hi), axis=0) - window, 0)
            d = tl.arange(0, BLOCK_D)
            d_mask = d < HEAD_DIM
            heads = kvh * GROUP + r % GROUP
            rd_mask = valid[:, None] & d_mask[None, :]
            q = tl.load(q_ptr + rows[:, None] * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=rd_mask,
                        other=0.0)
            m, l, acc = _attend_keys(
                q, k_ptr, v_ptr, bt_ptr + b * stride_btb, stride_btn, kvh, d, d_mask, lo, hi, pos, window, qk_scale,
                stride_kblk, stride_kslot, stride_kh, BLOCK_G, BLOCK_D, BLOCK_N, BLOCK_SIZE, True, HAS_WINDOW, IEEE)
            out = acc / tl.where(valid, l, 1.0)[:, None]
            tl.store(out_ptr + rows[:, None] * stride_ob + heads[:, None] * stride_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=rd_mask)

    @triton.jit
    def _combine_splits_kernel(
        part_acc_ptr, part_m_ptr, part_l_ptr, ctx_ptr, out_ptr, window, num_splits, min_chunk,
        stride_ctx, stride_ob, stride_oh,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
        BLOCK_S: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl.pdl_enter(PDL)
        # One program per (row, query head): merges the partitions that hold tokens (the first `active`, the same
        # split as the decode kernel's), each rescaled from its own running max to the common one. A row with one
        # partition was written out by the decode kernel.
        b = tl.program_id(0)
        h = tl.program_id(1)
        ctx = tl.load(ctx_ptr + b * stride_ctx).to(tl.int32)
        start, chunk, active = _split_chunk(ctx, window, num_splits, min_chunk, HAS_WINDOW, BLOCK_N)
        if active > 1:
            _merge_partitions(part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr, b, h, num_splits, active,
                              stride_ob, stride_oh, HEAD_DIM, BLOCK_D, BLOCK_S)

    @triton.jit
    def _merge_partitions(part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr, b, h, num_splits, active,
                          stride_ob, stride_oh, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_S: tl.constexpr):
        s = tl.arange(0, BLOCK_S)
        s_mask = s < active
        part = (b * tl.num_programs(1) + h) * num_splits + s
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        m = tl.load(part_m_ptr + part, mask=s_mask, other=float("-inf"))
        l = tl.load(part_l_ptr + part, mask=s_mask, other=0.0)
        acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None] & d_mask[None, :],
                      other=0.0)
        w = tl.exp2(m - tl.max(m, axis=0))  # the max is finite (partition 0 holds a token); skipped ones weigh 0
        out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
        tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)

    @triton.jit
    def _paged_prefill_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, last_ptr, qlen_ptr, ctx_ptr, out_ptr,
        qk_scale, window,
        stride_qn, stride_qh, stride_kblk, stride_kslot, stride_kh, stride_btb, stride_btn, stride_on, stride_oh,
        BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, QUERIES: tl.constexpr, BLOCK_M: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
        IEEE: tl.constexpr, PDL: tl.constexpr,
    ):
        # One program per (sequence, tile of QUERIES queries, KV head); row r of the tile is query r // GROUP,
        # head r % GROUP of the KV head's group. An online softmax (exp2, log2(e) folded into qk_scale).
        pdl.pdl_enter(PDL)
        s = tl.program_id(0)
        kvh = tl.program_id(2)
        qlen = tl.load(qlen_ptr + s).to(tl.int32)
        first = tl.program_id(1) * QUERIES
        if first < qlen:
            ctx = tl.load(ctx_ptr + s).to(tl.int32)
            row0 = tl.load(last_ptr + s) - qlen + 1  # packed row of the sequence's first new token
            r = tl.arange(0, BLOCK_M)
            i = first + r // GROUP
            valid = (r < QUERIES * GROUP) & (i < qlen)
            pos = tl.where(valid, ctx - qlen + i, -1)  # absolute positions; invalid rows see no key
            heads = kvh * GROUP + r % GROUP
            d = tl.arange(0, BLOCK_D)
            d_mask = d < HEAD_DIM
            rows = (row0 + i).to(tl.int64)
            q = tl.load(q_ptr + rows[:, None] * stride_qn + heads[:, None] * stride_qh + d[None, :],
                        mask=valid[:, None] & d_mask[None, :], other=0.0)
            hi = tl.minimum(ctx, ctx - qlen + tl.minimum(first + QUERIES, qlen))  # causal: up to the last query
            lo = 0
            if HAS_WINDOW:
                lo = tl.maximum(ctx - qlen + first - window + 1, 0) // BLOCK_N * BLOCK_N
            m, l, acc = _attend_keys(
                q, k_ptr, v_ptr, bt_ptr + s * stride_btb, stride_btn, kvh, d, d_mask, lo, hi, pos, window, qk_scale,
                stride_kblk, stride_kslot, stride_kh, BLOCK_M, BLOCK_D, BLOCK_N, BLOCK_SIZE, True, HAS_WINDOW, IEEE)
            out = acc / tl.where(valid, l, 1.0)[:, None]
            tl.store(out_ptr + rows[:, None] * stride_on + heads[:, None] * stride_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=valid[:, None] & d_mask[None, :])
