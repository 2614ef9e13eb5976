"""Tiles of the grouped projections (fused_linear.py): which tile sizes and pipeline depth a launch runs.

Up to 64 rows decode is a memory-bound GEMV, so `pick_tiles` keeps one row tile (every weight read once) and sizes
the column tiles by a rule measured at Qwen2.5-1.5B and 7B shapes. Decode batches of 128 and 256 rows use tiles
measured on an H100 at hidden 896 (`python -m bench.kernel_sweep`); the TMA gate/up kernel has its own
(`tma_gate_up_tiles`, `python -m bench.tma_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GEMV_ROWS = 64  # up to here the tiles follow the GEMV rule of `pick_tiles`
DEFAULT_SMS = 132  # H100 SXM; used where the device cannot be asked (interpreter)
# GEMV tiles: the widest column tile (at most 64 weight columns per program) that still gives a launch at least
# SMs / this many programs. H100 sweeps at Qwen2.5-1.5B/7B shapes (session-1126g/linear-ab): at 16 rows the fastest
# tiles ran 48-72 programs (1.5B q/k/v 6.2 us with 64 programs vs 10.6 with 256), at 64 rows 72-128.
_GEMV_SM_DIVISOR = {16: 3, 32: 3, 64: 2}
_GEMV_MAX_COLUMNS = 64
_SMEM_BUDGET = 96 * 1024  # bytes of pipelined tiles per program: two programs fit an SM's shared memory
_BLOCK_N_CHOICES = (64, 32, 16, 8)


@dataclass(frozen=True)
class LinearTiles:
    """Tiles and launch options of one grouped-projection launch; the launchers take one as `tiles=` (benchmarks),
    or pick their own (`pick_tiles`, `tma_gate_up_tiles`: what the engine runs)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# (weights per tile, rows up to) -> the fastest tiles of the H100 sweep at hidden 896: q/k/v (1) and gate/up (2).
# Fewer, larger tiles win there (72-300 programs); x is re-read from L2 by each column tile. At hidden 1536
# (Qwen2.5-1.5B q/k/v, 256 rows, session-1126g/linear-ab) (1, 256) was again the sweep's fastest: 7.9 us (the
# engine runs cuBLAS there all the same: linear_dispatch.py).
_LARGE_BATCH_TILES = {
    (1, 128): LinearTiles(64, 32, 128, num_warps=4, num_stages=4),
    (1, 256): LinearTiles(64, 64, 128, num_warps=4, num_stages=3),
    (2, 128): LinearTiles(128, 64, 64, num_warps=8, num_stages=4),
    (2, 256): LinearTiles(128, 32, 64, num_warps=4, num_stages=3),
}
# rows up to -> gate/up tiles of the TMA kernel (H100, `python -m bench.tma_probe`: 10.8 / 13.8 us per layer)
_TMA_GATE_UP_TILES = {
    128: LinearTiles(128, 64, 64, num_warps=4, num_stages=4),
    256: LinearTiles(128, 64, 64, num_warps=4, num_stages=3),
}


def for_element_size(tiles: LinearTiles, elem_size: int) -> LinearTiles:
    """Measured tiles (for 2-byte inputs) with BLOCK_K scaled so a pipeline stage holds the same bytes: float32 tiles
    of the same shape would need twice the shared memory (262,144 bytes for the 128-row gate/up, over an H100's
    232,448)."""
    return replace(tiles, block_k=max(16, tiles.block_k * 2 // elem_size))


def tma_gate_up_tiles(rows: int, elem_size: int) -> LinearTiles:
    """The measured tiles of the TMA gate/up kernel (above the GEMV range) for `rows` inputs of elem_size bytes."""
    return for_element_size(_TMA_GATE_UP_TILES[_bucket(rows)], elem_size)


def pick_tiles(rows: int, widths: tuple[int, ...], k: int, elem_size: int, weights_per_tile: int = 1,
               sms: int = DEFAULT_SMS) -> LinearTiles:
    """Tiles for `rows` x [sum(widths)] output columns over a reduction of length k.

    BLOCK_M: the smallest of 16/32/64 holding all rows (tl.dot wants >= 16; extra rows are masked, never read),
    so up to 64 rows every weight byte is read once. BLOCK_N: the largest of 64/32/16/8 with at most
    _GEMV_MAX_COLUMNS weight columns per program (gate/up: 32) whose launch still has sms / _GEMV_SM_DIVISOR
    programs (Qwen2.5-1.5B q/k/v at batch 1: 2048 columns -> 32, 64 programs; 7B: 4608 -> 64, 72 programs), not below
    BLOCK_M / 4, where re-reading x per column tile would cost more L2 traffic than the weights. BLOCK_K 128 (64 for
    gate/up at 64 rows, two accumulators per program: 23.6 vs 25.8 us per layer at 1.5B, a tie at 7B), and as many
    stages (2-4) as _SMEM_BUDGET holds. More than 64 rows: the measured `_LARGE_BATCH_TILES` of the next bucket
    (128 or 256).
    """
    if rows > GEMV_ROWS:
        return for_element_size(_LARGE_BATCH_TILES[(weights_per_tile, _bucket(rows))], elem_size)
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    row_tiles = -(-rows // block_m)
    min_n, max_n = max(8, block_m // 4), _GEMV_MAX_COLUMNS // weights_per_tile
    min_programs = sms // _GEMV_SM_DIVISOR[block_m]
    block_n = min_n
    for bn in _BLOCK_N_CHOICES:
        if min_n <= bn <= max_n and row_tiles * sum(-(-w // bn) for w in widths) >= min_programs:
            block_n = bn
            break
    block_k = max(16, min(128 if elem_size <= 2 else 64, 1 << max(0, (k - 1).bit_length())))
    if weights_per_tile > 1 and block_m == 64:
        block_k = max(16, block_k // 2)
    stage_bytes = (block_m + weights_per_tile * block_n) * block_k * elem_size
    num_stages = max(2, min(4, _SMEM_BUDGET // stage_bytes))
    return LinearTiles(block_m, block_n, block_k, num_warps=4, num_stages=num_stages)


def _bucket(rows: int) -> int:
    """The decode batch bucket of the measured large-batch tiles."""
    return 128 if rows <= 128 else 256
