"""Paged attention against a dense reference: store_kv, prefill (with cached prefixes, GQA, windows) and decode."""

from __future__ import annotations

import inspect
import math
import os

import pytest
import torch

import tandemrl.engine.kernels.attention_tiles as attention_tiles
import tandemrl.engine.kernels.triton_attention as triton_attention
from tandemrl.engine.kernels.paged_kv import DecodeMeta, store_kv
from tandemrl.engine.model.attention import (
    query_groups,
    build_prefill_meta,
    decode_attention,
    prefill_attention,
    sdpa_decode,
)
from tandemrl.engine.kernels.attention_tiles import DEFAULT_DECODE_TILES, DecodeAttentionTiles, decode_splits
from tandemrl.engine.kernels.triton_attention import (
    triton_decode_available,
    triton_paged_decode,
    triton_paged_prefill,
)

BLOCK = 4


def _dense_attention(q, k, v, q_pos, scale, window=None):
    """q [Tq, H, D] at absolute positions q_pos; k, v [L, kvh, D] for positions 0..L-1. Loops, no tricks."""
    H, kvh = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    for t, p in enumerate(q_pos):
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(H):
            kh = h // (H // kvh)
            scores = (k[lo:p + 1, kh] @ q[t, h]) * scale
            out[t, h] = scores.softmax(-1) @ v[lo:p + 1, kh]
    return out


def _cache_with(contexts, kvh, D, num_blocks=32, seed=0):
    """Random contexts written into shuffled blocks; returns caches and each sequence's block table."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.zeros(num_blocks, BLOCK, kvh, D)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks, generator=g).tolist()
    tables = []
    for k, v in contexts:
        n = -(-k.shape[0] // BLOCK)
        table, free = free[:n], free[n:]
        slots = torch.tensor([table[t // BLOCK] * BLOCK + t % BLOCK for t in range(k.shape[0])])
        store_kv(k, v, k_cache, v_cache, slots)
        tables.append(table)
    return k_cache, v_cache, tables


def _padded(tables, pad=0):
    width = max(len(t) for t in tables)
    return torch.tensor([t + [pad] * (width - len(t)) for t in tables])


def test_store_kv_writes_slots():
    k_cache = torch.zeros(3, BLOCK, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    k = torch.arange(6.0).view(3, 1, 2)
    store_kv(k, -k, k_cache, v_cache, torch.tensor([5, 0, 11]))
    assert torch.equal(k_cache[1, 1, 0], k[0, 0]) and torch.equal(k_cache[0, 0, 0], k[1, 0])
    assert torch.equal(v_cache[2, 3, 0], -k[2, 0])
    assert k_cache.abs().sum() == k.abs().sum()


@pytest.mark.parametrize("H,kvh,window", [(2, 1, None), (4, 2, None), (4, 4, 3), (6, 2, 5)])
def test_prefill_matches_dense(H, kvh, window):
    torch.manual_seed(0)
    D = 8
    ctx_lens, q_lens = [7, 13, 4, 9], [7, 5, 1, 9]  # seq 1 and 2 have cached prefixes
    contexts = [(torch.randn(n, kvh, D), torch.randn(n, kvh, D)) for n in ctx_lens]
    k_cache, v_cache, tables = _cache_with(contexts, kvh, D)
    meta = build_prefill_meta(q_lens, ctx_lens, _padded(tables), BLOCK, torch.device("cpu"))
    qs = [torch.randn(ql, H, D) for ql in q_lens]
    out = prefill_attention(torch.cat(qs), k_cache, v_cache, meta, D ** -0.5, window)
    expected = torch.cat([
        _dense_attention(q, k, v, list(range(n - ql, n)), D ** -0.5, window)
        for q, (k, v), n, ql in zip(qs, contexts, ctx_lens, q_lens)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert meta.positions.tolist() == [p for n, ql in zip(ctx_lens, q_lens) for p in range(n - ql, n)]
    assert meta.last_rows.tolist() == [6, 11, 12, 21]


def test_prefill_chunks_agree(monkeypatch):
    """A batch split into several SDPA calls computes what one call does."""
    import tandemrl.engine.model.attention as attention

    torch.manual_seed(1)
    D, H, kvh = 8, 4, 2
    ctx_lens, q_lens = [9, 5, 12], [3, 5, 12]
    contexts = [(torch.randn(n, kvh, D), torch.randn(n, kvh, D)) for n in ctx_lens]
    k_cache, v_cache, tables = _cache_with(contexts, kvh, D)
    meta = build_prefill_meta(q_lens, ctx_lens, _padded(tables), BLOCK, torch.device("cpu"))
    q = torch.randn(sum(q_lens), H, D)
    whole = prefill_attention(q, k_cache, v_cache, meta, 0.3, None)
    monkeypatch.setattr(attention, "_PREFILL_MASK_ELEMENTS", 1)  # one sequence per call
    torch.testing.assert_close(prefill_attention(q, k_cache, v_cache, meta, 0.3, None), whole)


@pytest.mark.parametrize("H,kvh,window", [(2, 1, None), (6, 2, None), (4, 4, 4)])
def test_decode_matches_dense(H, kvh, window):
    torch.manual_seed(2)
    D = 8
    ctx_lens = [1, 6, 17]
    contexts = [(torch.randn(n, kvh, D), torch.randn(n, kvh, D)) for n in ctx_lens]
    k_cache, v_cache, tables = _cache_with(contexts, kvh, D)
    q = torch.randn(len(ctx_lens), H, D)
    meta = DecodeMeta(positions=torch.tensor(ctx_lens) - 1, slot_mapping=torch.zeros(3, dtype=torch.long),
                      block_tables=_padded(tables, pad=31), context_lens=torch.tensor(ctx_lens))
    out = decode_attention(q, k_cache, v_cache, meta, D ** -0.5, window)
    for b, ((k, v), n) in enumerate(zip(contexts, ctx_lens)):
        expected = _dense_attention(q[b:b + 1], k, v, [n - 1], D ** -0.5, window)
        torch.testing.assert_close(out[b:b + 1], expected, atol=1e-5, rtol=1e-5)


def test_bad_prefill_lengths_raise():
    with pytest.raises(ValueError, match="query_len"):
        build_prefill_meta([3], [2], torch.zeros(1, 1, dtype=torch.long), BLOCK, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_decode_available(torch.device("cuda")),
                    reason="the Triton decode kernel needs CUDA and triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,kvh,D,window", [(14, 2, 64, None), (16, 8, 128, None), (4, 4, 64, 37), (6, 2, 80, None)])
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_triton_decode_matches_sdpa(dtype, H, kvh, D, window, splits):
    torch.manual_seed(3)
    dev = torch.device("cuda")
    nb, bs, B = 300, 16, 9
    k_cache = torch.randn(nb, bs, kvh, D, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    tables = torch.stack([torch.randperm(nb, device=dev)[:40] for _ in range(B)])
    ctx = torch.tensor([1, 2, 15, 16, 17, 64, 65, 333, 640], device=dev)
    q = torch.randn(B, H, D, device=dev, dtype=dtype)
    ref = sdpa_decode(q.float(), k_cache.float(), v_cache.float(), tables, ctx, 1 / math.sqrt(D), window)
    out = triton_paged_decode(q, k_cache, v_cache, tables, ctx, 1 / math.sqrt(D), window, num_splits=splits)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


# ---------------------------------------------------------------------------------------------- split-K decode

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_INTERPRET = triton_attention.triton is not None and os.environ.get("TRITON_INTERPRET") == "1"
needs_kernels = pytest.mark.skipif(triton_attention.triton is None or not (torch.cuda.is_available() or _INTERPRET),
                                   reason="needs Triton and CUDA (or TRITON_INTERPRET=1)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or triton_attention.triton is None,
                                reason="needs a CUDA device and Triton")


def test_decode_splits_depend_on_shapes_only():
    # batch 1, 2 KV heads, 4096-token tables on 132 SMs: as many partitions as allowed
    assert decode_splits(1, 2, 256, 16, 132) == attention_tiles.MAX_SPLITS
    # rows x heads reaching two programs per SM: one split (the single-pass kernel)
    assert decode_splits(132, 2, 256, 16, 132) == 1 and decode_splits(256, 2, 256, 16, 132) == 1
    assert decode_splits(32, 2, 256, 16, 132) == 5  # ceil(264 / 64): two programs per SM
    assert decode_splits(8, 2, 256, 16, 132) == 17  # ceil(264 / 16)
    # never more partitions than 64-token tiles in the widest context the table allows
    assert decode_splits(1, 2, 4, 16, 132) == 1 and decode_splits(1, 2, 9, 16, 132) == 3
    counts = [decode_splits(b, 2, 256, 16, 132) for b in range(1, 300)]
    assert counts == sorted(counts, reverse=True)
    # explicit tiles: twice the waves, about twice the partitions (33, not 17); 128-token tiles, fewer of them
    assert decode_splits(8, 2, 256, 16, 132, tiles=DecodeAttentionTiles(split_target_waves=4)) == 33
    assert decode_splits(1, 2, 9, 16, 132, tiles=DecodeAttentionTiles(block_n=128)) == 2


def test_long_contexts_split_where_rows_fill_the_sms():
    """64 rows x 2 KV heads (1.5B, batch 64) and 32 x 4 (7B, batch 32): one program per SM before; now 3
    partitions where the table allows contexts over 1024 tokens, none where it does not (a 640-token table)."""
    assert decode_splits(64, 2, 9216 // 16, 16, 132) == 3 and decode_splits(32, 4, 4096 // 16, 16, 132) == 3
    assert decode_splits(64, 2, 40, 16, 132) == 1 and decode_splits(64, 2, 128, 16, 132) == 2
    assert attention_tiles.split_min_tokens(128, 132) == DEFAULT_DECODE_TILES.long_split_tokens
    assert attention_tiles.split_min_tokens(65, 132) == DEFAULT_DECODE_TILES.block_n


def test_kv_tiles_keep_their_bytes_per_stage():
    tile = attention_tiles.kv_tile_tokens
    assert tile(128, 64, 2) == 128 and tile(128, 128, 2) == 64 and tile(128, 128, 1) == 128
    assert tile(64, 80, 2) == 32 and tile(16, 256, 4) == 16 and tile(64, 64, 4) == 32


def test_decode_tile_defaults_are_the_tuned_values():
    """What the engine launches (it passes no tiles): changing a default is a tuning decision, made here too."""
    assert DEFAULT_DECODE_TILES == DecodeAttentionTiles() == DecodeAttentionTiles(
        block_n=64, stages=3, single_pass_block_n=128, single_pass_stages=2, num_warps=4, split_target_waves=2,
        long_split_tokens=1024)
    for fn in (triton_paged_decode, decode_splits):
        assert inspect.signature(fn).parameters["tiles"].default is DEFAULT_DECODE_TILES


def _split_case(dtype, H, kvh, D, ctx_lens, seed):
    """Random caches, shuffled column-major block tables (as CUDA graphs stage them), a strided q, the reference."""
    g = torch.Generator().manual_seed(seed)
    nb, bs, B = 64, 16, len(ctx_lens)
    width = max(-(-n // bs) for n in ctx_lens) + 2  # padded wider than any context
    k_cache = torch.randn(nb, bs, kvh, D, generator=g).to(KERNEL_DEVICE, dtype)
    v_cache = torch.randn(nb, bs, kvh, D, generator=g).to(KERNEL_DEVICE, dtype)
    tables = torch.stack([torch.randperm(nb, generator=g)[:width] for _ in range(B)]).to(KERNEL_DEVICE)
    q = torch.randn(B, H + 3, D, generator=g).to(KERNEL_DEVICE, dtype)[:, 1:H + 1]  # rows and heads strided
    ctx = torch.tensor(ctx_lens, device=KERNEL_DEVICE)
    return q, k_cache, v_cache, tables, ctx


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16 if torch.cuda.is_available() else torch.float16])
@pytest.mark.parametrize("H,kvh,D,window,splits", [
    (6, 2, 32, None, 3), (6, 2, 32, 37, 2), (4, 4, 16, None, None), (7, 1, 64, None, 1), (4, 2, 48, 150, 7)])
def test_triton_decode_splits_match_sdpa(dtype, H, kvh, D, window, splits):
    """Partitions of uneven size, partitions past short rows' contexts (ctx 1, 16: nothing to merge but the
    first), windows that start mid-block; q a strided view and the block tables column-major."""
    q, k_cache, v_cache, tables, ctx = _split_case(dtype, H, kvh, D, [1, 16, 17, 65, 200], seed=H * D)
    strided_tables = tables.t().contiguous().t()
    ref = sdpa_decode(q.float(), k_cache.float(), v_cache.float(), tables, ctx, D ** -0.5, window)
    if torch.cuda.is_available():  # freed memory full of NaN: an output or partial never written shows up
        torch.full((1 << 22,), float("nan"), device="cuda")  # allocated and freed at once
    out = triton_paged_decode(q, k_cache, v_cache, strided_tables, ctx, D ** -0.5, window, num_splits=splits)
    assert out.shape == ref.shape and out.dtype == dtype and not out.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("window", [None, 150])
def test_long_split_regime_merges_long_rows_and_writes_short_ones_directly(monkeypatch, window):
    """Rows x KV heads filling half the SMs (4 here): partitions of at least long_split_tokens, so rows of at
    most that many tokens are written by partition 0 itself (no merge), longer ones merged; every row written."""
    monkeypatch.setattr(triton_attention, "device_sm_count", lambda device: 4)
    tiles = DecodeAttentionTiles(long_split_tokens=64)
    q, k_cache, v_cache, tables, ctx = _split_case(torch.float32, 6, 2, 32, [1, 16, 64, 65, 200, 129], seed=11)
    assert attention_tiles.split_min_tokens(len(ctx) * 2, 4, tiles) == 64
    ref = sdpa_decode(q, k_cache, v_cache, tables, ctx, 32 ** -0.5, window)
    if torch.cuda.is_available():
        torch.full((1 << 22,), float("nan"), device="cuda")
    out = triton_paged_decode(q, k_cache, v_cache, tables, ctx, 32 ** -0.5, window, num_splits=3, tiles=tiles)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_cache_is_dequantised_on_load(splits):
    """An fp8 (e4m3) cache: the kernel attends over exactly the dequantised values (scale 1.0)."""
    q, k_cache, v_cache, tables, ctx = _split_case(torch.float32, 6, 2, 32, [1, 16, 17, 65, 200], seed=5)
    k8, v8 = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    ref = sdpa_decode(q, k8.float(), v8.float(), tables, ctx, 32 ** -0.5, None)
    out = triton_paged_decode(q, k8, v8, tables, ctx, 32 ** -0.5, None, num_splits=splits)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sdpa_decode(q, k8, v8, tables, ctx, 32 ** -0.5, None), ref)  # the SDPA path too
    assert not torch.allclose(ref, sdpa_decode(q, k_cache, v_cache, tables, ctx, 32 ** -0.5, None), atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("splits,window", [(1, None), (3, 37), (None, None)])
def test_triton_decode_with_explicit_tiles_matches_sdpa(splits, window):
    """Tiles other than the defaults (as a benchmark passes them) for the single-pass kernel, split-K with its
    merge, and the split count the tiles' waves pick (14 on 132 SMs): the same attention."""
    tiles = DecodeAttentionTiles(block_n=16, stages=2, single_pass_block_n=32, single_pass_stages=3, num_warps=2,
                                 split_target_waves=1)
    q, k_cache, v_cache, tables, ctx = _split_case(torch.float32, 6, 2, 32, [1, 16, 17, 65, 200], seed=7)
    ref = sdpa_decode(q, k_cache, v_cache, tables, ctx, 32 ** -0.5, window)
    out = triton_paged_decode(q, k_cache, v_cache, tables, ctx, 32 ** -0.5, window, num_splits=splits, tiles=tiles)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16 if torch.cuda.is_available() else torch.float16])
@pytest.mark.parametrize("H,kvh,window", [(4, 2, None), (6, 2, 37), (8, 1, None)])
def test_grouped_decode_matches_sdpa(dtype, H, kvh, window):
    """Rows of one sequence side by side (a verify step, a tandem forward) attended by one program per group: runs
    longer than a program's capacity (cut in several groups), single rows, the padding row of a graph bucket (one
    token of a scratch block), each query seeing keys up to its own position only. Same as one row at a time."""
    capacity = attention_tiles.decode_query_capacity(H, kvh)
    runs = [(0, 3), (1, 1), (2, capacity + 2), (3, 2 * capacity), (4, 1)]  # (sequence, queries)
    contexts = [40, 17, 200, 65, 1]
    q, k_cache, v_cache, tables, _ = _split_case(dtype, H, kvh, 32, contexts, seed=H + kvh)
    seq = torch.tensor([s for s, n in runs for _ in range(n)], device=KERNEL_DEVICE)
    ctx = torch.cat([torch.arange(contexts[s] - n + 1, contexts[s] + 1) for s, n in runs]).to(KERNEL_DEVICE)
    rows_q = q[seq]
    groups = torch.tensor(query_groups(seq.cpu().numpy(), capacity), device=KERNEL_DEVICE)
    assert int(groups.max()) == capacity and int(groups.sum()) == len(seq)
    ref = sdpa_decode(rows_q.float(), k_cache.float(), v_cache.float(), tables[seq], ctx, 32 ** -0.5, window)
    out = triton_paged_decode(rows_q, k_cache, v_cache, tables[seq], ctx, 32 ** -0.5, window, query_groups=groups)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    shuffled = groups.roll(1)  # a wrong grouping attends other rows' positions: the test can fail
    wrong = triton_paged_decode(rows_q, k_cache, v_cache, tables[seq], ctx, 32 ** -0.5, window, query_groups=shuffled)
    assert not torch.allclose(wrong.float(), ref, atol=tol, rtol=tol)


def test_triton_decode_rejects_bad_splits():
    if triton_attention.triton is None:
        pytest.skip("needs Triton")
    q, k_cache, v_cache, tables, ctx = _split_case(torch.float32, 2, 1, 16, [3], seed=0)
    with pytest.raises(ValueError, match="num_splits"):
        triton_paged_decode(q, k_cache, v_cache, tables, ctx, 0.25, None, num_splits=0)
    q, k_cache, v_cache, tables, ctx = _split_case(torch.float32, 3, 2, 16, [3], seed=0)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        triton_paged_decode(q, k_cache, v_cache, tables, ctx, 0.25, None)


@needs_cuda
@pytest.mark.parametrize("B,width", [(1, 64), (8, 64), (200, 64), (64, 256)])
def test_triton_decode_graph_replays_with_new_context_lens(B, width):
    """Split counts come from shapes only: one capture serves contexts of any length, short or long (64 rows x 2
    KV heads, 4096-token table: long partitions, short rows written directly, long ones merged)."""
    torch.manual_seed(B)
    dev, nb, bs, H, kvh, D = torch.device("cuda"), 2048, 16, 14, 2, 64
    k_cache = torch.randn(nb, bs, kvh, D, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(B, H, D, device=dev, dtype=torch.bfloat16)
    tables = torch.stack([torch.randperm(nb, device=dev)[:width] for _ in range(B)])
    staged = tables.t().contiguous().t()
    ctx = torch.randint(1, 50, (B,), device=dev)
    if B == 64:  # the long-context regime is what this case is for
        assert decode_splits(B, kvh, width, bs, attention_tiles.device_sm_count(dev)) > 1
    triton_paged_decode(q, k_cache, v_cache, staged, ctx, 0.125, None)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_paged_decode(q, k_cache, v_cache, staged, ctx, 0.125, None)
    for lens in (torch.randint(1, width * bs + 1, (B,)), torch.full((B,), width * bs), torch.ones(B)):
        ctx.copy_(lens)
        graph.replay()
        ref = sdpa_decode(q.float(), k_cache.float(), v_cache.float(), tables, ctx, 0.125, None)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------------- Triton prefill

@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16 if torch.cuda.is_available() else torch.float16])
@pytest.mark.parametrize("H,kvh,D,window", [(14, 2, 64, None), (4, 4, 16, None), (6, 2, 32, 9), (8, 1, 48, None)])
def test_triton_prefill_matches_sdpa(dtype, H, kvh, D, window):
    """Cached prefixes (query shorter than context), several query tiles per sequence (group 7: 18 queries per
    tile), a one-token query, windows starting mid-block, shuffled blocks of 16; every output row written."""
    g = torch.Generator().manual_seed(H * D)
    ctx_lens, q_lens = [40, 23, 5, 70, 1], [40, 7, 1, 33, 1]
    nb, bs = 40, 16
    k_cache = torch.randn(nb, bs, kvh, D, generator=g).to(KERNEL_DEVICE, dtype)
    v_cache = torch.randn(nb, bs, kvh, D, generator=g).to(KERNEL_DEVICE, dtype)
    free = torch.randperm(nb, generator=g).tolist()
    tables = []
    for n in ctx_lens:
        blocks = -(-n // bs)
        tables.append(free[:blocks])
        free = free[blocks:]
    meta = build_prefill_meta(q_lens, ctx_lens, _padded(tables), bs, torch.device(KERNEL_DEVICE), use_triton=True)
    q = torch.randn(sum(q_lens), H + 2, D, generator=g).to(KERNEL_DEVICE, dtype)[:, 1:H + 1]  # strided heads
    ref_meta = build_prefill_meta(q_lens, ctx_lens, _padded(tables), bs, torch.device(KERNEL_DEVICE))
    ref = prefill_attention(q.float(), k_cache.float(), v_cache.float(), ref_meta, D ** -0.5, window)
    if torch.cuda.is_available():  # freed memory full of NaN: an output row never written shows up
        torch.full((1 << 22,), float("nan"), device="cuda")
    out = prefill_attention(q, k_cache, v_cache, meta, D ** -0.5, window)  # meta.use_triton: the kernel
    assert out.shape == ref.shape and out.dtype == dtype and not out.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    assert torch.equal(out, triton_paged_prefill(q, k_cache, v_cache, meta, D ** -0.5, window))
