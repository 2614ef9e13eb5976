"""How `triton_paged_decode` is launched, from host-known shapes: the tile sizes, the split-K partitions of long
contexts, the query rows a program attends for. Pure host code (no Triton): the engine sizes its query groups with
it, the benchmarks sweep it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeAttentionTiles:
    """Launch choices of `triton_paged_decode`: a parameter, so benchmarks sweep them without touching the module.
    The defaults are what the engine runs (its callers pass nothing); changing one is a tuning decision.

    Token counts are for head_dim 64 with 2-byte K/V (where they were measured); `kv_tile_tokens` scales them so a
    pipeline stage holds the same bytes at any head size and cache dtype (head_dim 128 in bf16: half the tokens;
    in fp8: the same). At 128 tokens x 128 dims a 2-stage single pass needs 128 KiB of shared memory, one program
    per SM, which left the KV reads of long contexts at half the bandwidth. Long partitions (`long_split_tokens`)
    use the single-pass tiles; `block_n` / `stages` serve the short partitions of few rows.

    Split-K: at head_dim 64 in bf16 on sm_90, 64 tokens x 4 warps compiles to 80 registers and 21 KiB of shared
    memory (the next K and V tiles prefetched by cp.async): ~6 programs fit an SM, so 256 rows x 2 KV heads run in
    one wave with ~16 KiB each in flight. 128-token tiles (96 registers, 40 KiB) halve the loop trips; 8 warps halve
    the registers but not the per-program latency. Single pass (one program per row and KV head): 128-token tiles
    with 2 stages were fastest on an H100 (`python -m bench.kernel_sweep`, context 384: 9.8 vs 11.1 us per layer at
    64 rows, 21.9 vs 22.0 at 256).
    """

    block_n: int = 64  # split-K: tokens per inner step, and the granularity of the partitions
    stages: int = 3  # split-K: software pipelining depth of the K/V loads (Triton's default)
    single_pass_block_n: int = 128
    single_pass_stages: int = 2
    num_warps: int = 4  # both variants
    split_target_waves: int = 2  # `decode_splits` aims at this many decode programs per SM
    # Shortest partition once rows x KV heads fill half the SMs: there a split pays for its workspace round trip
    # and merge only on long contexts (a row whose context fits one partition skips both).
    long_split_tokens: int = 1024


DEFAULT_DECODE_TILES = DecodeAttentionTiles()

MAX_SPLITS = 64  # the merge kernel reads all partitions of a head as one [splits, head_dim] tile
FALLBACK_SM_COUNT = 132  # off CUDA (the interpreter): an H100's


def decode_query_capacity(num_heads: int, kv_heads: int) -> int:
    """Rows one decode program attends for at most with ``query_groups``: as many queries as fill the tile rows
    the GROUP query heads of a KV head leave free (16 rows of the tensor-core tile: 8 queries at 2 heads per KV
    head), so grouping costs no extra math."""
    group = num_heads // kv_heads
    return decode_rows(group) // group


def decode_rows(group: int) -> int:
    """Tile rows of a decode program: the GROUP query heads of a KV head, padded to a power of two, at least 16."""
    return max(16, 1 << (group - 1).bit_length())


def decode_splits(rows: int, kv_heads: int, width: int, block_size: int, sm_count: int, *,
                  tiles: DecodeAttentionTiles = DEFAULT_DECODE_TILES) -> int:
    """Partitions per (row, KV head) context for `triton_paged_decode`, from host-known shapes only (a CUDA graph
    captured per (rows, width) keeps its grid; each row's context length picks on the device how many of them it
    fills, see `split_min_tokens`).

    When rows x KV heads reach `tiles.split_target_waves` programs per SM: 1, the single-pass kernel without
    workspace or merge. Below that, enough partitions for that many programs per SM (a decode program is
    latency-bound: more of them in flight means more bytes in flight), never more than partitions of
    `split_min_tokens` in the widest context the table allows (the rest would always be empty), at most MAX_SPLITS
    (the merge reads them in one tile). So 64 rows x 2 KV heads on 132 SMs get 3 partitions of contexts over 1024
    tokens (they ran at one program per SM, half the bandwidth), and shorter contexts stay in one.
    """
    programs = rows * kv_heads
    target = tiles.split_target_waves * sm_count
    if programs >= target:
        return 1
    partitions = -(-width * block_size // split_min_tokens(programs, sm_count, tiles))
    return max(1, min(-(-target // programs), partitions, MAX_SPLITS))


def split_min_tokens(programs: int, sm_count: int, tiles: DecodeAttentionTiles = DEFAULT_DECODE_TILES) -> int:
    """The shortest partition of a split context (the kernel rounds it up to whole tiles): one tile while rows x KV
    heads leave more than half the SMs idle (batch 1: any context gains from more programs); else
    `tiles.long_split_tokens`, so a context that fits one partition is attended as by the single pass and written
    out directly, without the merge."""
    return tiles.block_n if few_programs(programs, sm_count) else tiles.long_split_tokens


def few_programs(programs: int, sm_count: int) -> bool:
    """Whether (row, KV head) programs leave more than half the SMs idle."""
    return 2 * programs < sm_count


def kv_tile_tokens(tokens: int, head_dim: int, kv_element_size: int) -> int:
    """Tokens per K/V tile for `tokens` given at head_dim 64 in 2-byte K/V: the same bytes per pipeline stage (shared
    memory, and so programs per SM) at any head size and cache dtype; a power of two, at least 16 (tl.dot)."""
    scaled = tokens * 64 * 2 // ((1 << (head_dim - 1).bit_length()) * kv_element_size)
    return max(16, 1 << (max(1, scaled) - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    """The device's SM count; off CUDA (Triton's interpreter) an H100's, so tests walk the same split policy."""
    if device.type != "cuda":
        return FALLBACK_SM_COUNT
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())
