"""The paged K/V cache as both the kernels and the model layer see it: the attention metadata of a prefill and of a
decode step, and the reference K/V store (the fused RoPE kernel's fallback, the SDPA path's writer).

Cache layout (one pair per layer): ``k_cache``, ``v_cache`` of shape [num_blocks, block_size, kv_heads, head_dim];
token t of a sequence lives in slot ``block_table[t // block_size] * block_size + t % block_size``.
Here, below model/attention.py, so the kernels import nothing from the model layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FP8_E4M3_MAX = 448.0  # largest finite float8 e4m3fn value


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
    # [B] long, optional: rows of one sequence side by side attend as a group (see ``query_groups``); a hint to the
    # Triton kernel (each group's K/V read once), the result is the same
    query_groups: Tensor | None = None


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write k, v [N, kv_heads, head_dim] into the flattened caches at slot_mapping [N]."""
    for x, cache in ((k, k_cache), (v, v_cache)):
        flat, x = cache.view(-1, *cache.shape[-2:]), to_cache_dtype(x, cache.dtype)
        if cache.element_size() == 1:  # index_copy_ has no float8 kernels: copy the bytes
            flat, x = flat.view(torch.uint8), x.view(torch.uint8)
        flat.index_copy_(0, slot_mapping, x)


def to_cache_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x as the cache stores it: an fp8 cache (scale 1.0) saturates at its largest finite value, where torch's
    cast would give NaN; the Triton store does the same."""
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return x.to(dtype)
