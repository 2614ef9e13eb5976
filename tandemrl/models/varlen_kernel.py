"""Causal attention over sequences packed one after another, given by cumulative offsets: torch's own
``torch.nn.attention.varlen.varlen_attn`` (flash attention with a backward, CUDA only, no compilation) on a GPU, the
same computed sequence by sequence with scaled_dot_product_attention elsewhere (the reference the CPU tests run).

varlen_attn's signature moved between torch releases: 2.9 takes ``is_causal``; later ones ``window_size`` ((-1, 0)
is causal) and ``scale``; later still ``enable_gqa``. The call adapts to the installed one by its parameter names.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

KEY = "model.attn_implementation = 'varlen'"  # every error names the setting that asked for this attention
FLASH_DTYPES = (torch.float16, torch.bfloat16)


class VarlenAttentionError(RuntimeError):
    """The varlen attention cannot run here; the message names ``model.attn_implementation``."""


@dataclass(frozen=True)
class Sequences:
    cu_seq_lens: Tensor  # [n + 1] int32: where each packed sequence starts, then the token count
    max_length: int  # the longest sequence's length


def causal_varlen_attention(query: Tensor, key: Tensor, value: Tensor, sequences: Sequences, scale: float) -> Tensor:
    """Each sequence attends causally to itself alone. ``query`` [T, Hq, D], ``key``/``value`` [T, Hkv, D] with Hq a
    multiple of Hkv (grouped-query attention); returns [T, Hq, D]."""
    if not query.is_cuda:
        return per_sequence_attention(query, key, value, sequences, scale)
    if query.dtype not in FLASH_DTYPES:
        raise VarlenAttentionError(f"{KEY} runs flash attention, which takes bfloat16 or float16 on CUDA, not "
                                   f"{query.dtype}: set model.dtype, or another model.attn_implementation")
    return flash_varlen_attention(torch_varlen_attn(), query, key, value, sequences, scale)


def torch_varlen_attn() -> Callable[..., Tensor]:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise VarlenAttentionError(f"{KEY} needs torch.nn.attention.varlen.varlen_attn (torch >= 2.9; this is "
                                   f"torch {torch.__version__}): use 'flex_attention' or 'sdpa'") from exc
    return varlen_attn


def flash_varlen_attention(varlen_attn: Callable[..., Tensor], query: Tensor, key: Tensor, value: Tensor,
                           sequences: Sequences, scale: float) -> Tensor:
    """``varlen_attn`` called the way its signature takes causal masking, the scale and grouped-query heads."""
    accepts = _parameter_names(varlen_attn)
    options: dict[str, object] = {}
    if "window_size" in accepts:
        options["window_size"] = (-1, 0)
    elif "is_causal" in accepts:
        options["is_causal"] = True
    else:
        raise VarlenAttentionError(f"{KEY}: torch {torch.__version__}'s varlen_attn takes neither window_size nor "
                                   f"is_causal (its parameters: {', '.join(accepts)}); use 'flex_attention' or 'sdpa'")
    if "scale" in accepts:
        options["scale"] = scale
    else:  # the kernel scales by 1/sqrt(D): fold the model's own scale into the queries
        query = query * (scale * query.shape[-1] ** 0.5)
    if key.shape[1] != query.shape[1]:
        if "enable_gqa" in accepts:
            options["enable_gqa"] = True
        else:
            key, value = _repeat_kv(key, query.shape[1]), _repeat_kv(value, query.shape[1])
    cu, longest = sequences.cu_seq_lens, sequences.max_length
    return varlen_attn(query, key, value, cu, cu, longest, longest, **options)


@torch.compiler.disable  # a Python loop over the offsets: traced, it would recompile per sequence count (model.compile)
def per_sequence_attention(query: Tensor, key: Tensor, value: Tensor, sequences: Sequences, scale: float) -> Tensor:
    """The reference: scaled_dot_product_attention(is_causal=True) on each sequence in turn."""
    key, value = _repeat_kv(key, query.shape[1]), _repeat_kv(value, query.shape[1])
    bounds = sequences.cu_seq_lens.tolist()
    outputs = []
    for start, end in zip(bounds, bounds[1:]):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # [H, L, D]
        outputs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outputs)


def _repeat_kv(states: Tensor, query_heads: int) -> Tensor:
    return states.repeat_interleave(query_heads // states.shape[1], dim=1)


@functools.cache
def _parameter_names(function: Callable[..., Tensor]) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)
