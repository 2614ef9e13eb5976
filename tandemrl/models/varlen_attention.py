"""``attn_implementation="varlen"``: transformers attention over packed sequences through torch's varlen_attn.

The packed training forward (train/packing.py) hands the decoder ``cu_seq_lens_q/k`` and ``max_length_q/k``, as
transformers' FlashAttentionKwargs are passed; without them the sequences are read off ``position_ids`` (a new one
wherever a position does not follow its predecessor, and at every row). No mask is built for such a forward. Anything
else (padded rows, a KV cache: Hugging Face generate) gets sdpa's mask and runs sdpa, so the model still generates.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from tandemrl.models.varlen_kernel import KEY, Sequences, VarlenAttentionError, causal_varlen_attention

VARLEN = "varlen"


def register_varlen_attention() -> None:
    """Make ``attn_implementation="varlen"`` known to transformers (before from_pretrained / from_config)."""
    AttentionInterface.register(VARLEN, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN, varlen_attention_mask)


def varlen_attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int | Tensor = 0,
                          kv_offset: int | Tensor = 0, attention_mask: Tensor | None = None, **kwargs):
    """None where each row (or each sequence packed in it) attends causally to itself alone: no padding, no cached
    tokens. Otherwise sdpa's mask, for varlen_attention_forward to hand to sdpa."""
    if attention_mask is None and q_length == kv_length and _is_zero(q_offset) and _is_zero(kv_offset):
        return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)


def varlen_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             sliding_window: int | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention signature: ``query`` [B, Hq, S, D], ``key``/``value`` [B, Hkv, S, D] ->
    ([B, S, Hq, D], no weights)."""
    if attention_mask is not None or query.shape[2] != key.shape[2]:  # padded rows or a cache: the mask decides
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    _check_plain_causal(module, dropout, sliding_window)
    rows, heads, length, dim = query.shape
    sequences = _sequences(kwargs, rows, length, query.device)
    out = causal_varlen_attention(_flat(query), _flat(key), _flat(value), sequences,
                                  scaling if scaling is not None else dim**-0.5)
    return out.view(rows, length, heads, dim), None


def sequences_from_positions(position_ids: Tensor | None, rows: int, length: int,
                             device: torch.device) -> Sequences:
    """A sequence starts at each row's first token and wherever a position does not follow its predecessor."""
    positions = torch.arange(length, device=device) if position_ids is None else position_ids.to(device)
    positions = positions.expand(rows, length)
    starts = torch.ones(rows, length, dtype=torch.bool, device=device)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    start_index = starts.flatten().nonzero().flatten()
    cu_seq_lens = torch.cat([start_index, start_index.new_tensor([rows * length])]).to(torch.int32)
    return Sequences(cu_seq_lens, int(cu_seq_lens.diff().max()))


def _sequences(kwargs: dict, rows: int, length: int, device: torch.device) -> Sequences:
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        return sequences_from_positions(kwargs.get("position_ids"), rows, length, device)
    longest = kwargs.get("max_length_q")
    cu_seq_lens = cu_seq_lens.to(device=device, dtype=torch.int32)
    if longest is None:
        return Sequences(cu_seq_lens, int(cu_seq_lens.diff().max()))
    # An int stays as it is: under model.compile it is symbolic, and int() would specialise the graph on its value.
    return Sequences(cu_seq_lens, longest if isinstance(longest, (int, torch.SymInt)) else int(longest))


def _check_plain_causal(module: nn.Module, dropout: float, sliding_window: int | None) -> None:
    # The messages are formatted only when raising: under model.compile the dropout is symbolic, and formatting it
    # on the way in broke each compiled decoder layer's graph around its attention.
    if getattr(module, "is_causal", True) and not dropout > 0 and sliding_window is None:
        return
    unsupported = [what for what, present in (("bidirectional attention", not getattr(module, "is_causal", True)),
                                              (f"attention dropout ({dropout})", dropout > 0),
                                              (f"a sliding window ({sliding_window})", sliding_window is not None))
                   if present]
    raise VarlenAttentionError(f"{KEY} computes plain causal attention; {type(module).__name__} asks for "
                               f"{' and '.join(unsupported)}: use 'flex_attention' or 'sdpa'")


def _flat(states: Tensor) -> Tensor:
    """[B, H, S, D] -> [B * S, H, D]: the rows one after another."""
    rows, heads, length, dim = states.shape
    return states.transpose(1, 2).reshape(rows * length, heads, dim)


def _is_zero(offset: int | Tensor) -> bool:
    return isinstance(offset, int) and offset == 0
