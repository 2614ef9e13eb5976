"""A micro-batch's rows as one packed sequence: every real token once, no padding, positions restarting per row.

Hugging Face decoders given ``position_ids`` that restart (and no ``attention_mask``) confine attention to each
row: flash-attention through cu_seqlens, flex_attention through a document BlockMask, sdpa/eager through a
block-diagonal mask (transformers' masking_utils.find_packed_sequence_indices), ``varlen`` (models/varlen_attention.py)
through the rows' offsets, which the forward is handed. train/packed_support.py checks that a model does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.train.batch import TrainBatch


@dataclass
class PackedRows:
    input_ids: Tensor  # [1, N] long: each row's prompt + completion tokens, rows concatenated
    position_ids: Tensor  # [1, N] long: 0.. per row
    source: Tensor  # [n] long: index into the forward's flattened hidden states that predicts each completion token
    targets: Tensor  # [n] long: those completion tokens
    completion: Tensor  # [B, T] bool: where the n tokens sit in the batch's completion layout
    cu_seq_lens: Tensor  # [B + 1] int32: where each row starts in the pack, then N
    max_length: int  # the longest row's token count

    def offsets(self) -> dict[str, Tensor | int]:
        """The rows' offsets as transformers' FlashAttentionKwargs name them (the varlen attention reads them)."""
        return {"cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def pack(batch: TrainBatch) -> PackedRows:
    real = batch.attention_mask.bool()
    packed_index = real.flatten().cumsum(0).view_as(real) - 1  # [B, W]: each real token's place in the pack
    lengths = real.sum(1)
    return PackedRows(
        input_ids=batch.input_ids[real].unsqueeze(0),
        position_ids=batch.position_ids[real].unsqueeze(0),
        **_completion_sources(batch, packed_index),
        cu_seq_lens=torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32),
        max_length=int(lengths.max()),
    )


def padded_sources(batch: TrainBatch) -> dict[str, Tensor]:
    """``source``/``targets``/``completion`` for a padded [B, W] forward (the fallback of packed_support.py)."""
    rows, width = batch.input_ids.shape
    flat_index = torch.arange(rows * width, device=batch.input_ids.device).view(rows, width)
    return _completion_sources(batch, flat_index)


def _completion_sources(batch: TrainBatch, flat_index: Tensor) -> dict[str, Tensor]:
    """The state at position i predicts token i+1: completion token j of a row comes from column P-1+j."""
    start, width = batch.prompt_width, batch.completion_ids.shape[1]
    if not bool(batch.attention_mask[:, start - 1].all()):
        raise ValueError("every training row needs at least one prompt token (it predicts the first completion token)")
    completion = batch.attention_mask[:, start : start + width].bool()
    return {
        "source": flat_index[:, start - 1 : start - 1 + width][completion],
        "targets": batch.completion_ids[completion],
        "completion": completion,
    }


def padded_tokens(lengths: list[int], rows_per_forward: list[list[int]]) -> int:
    """Tokens a padded forward of these micro-batches computes on (each row as wide as its micro-batch's widest)."""
    return sum(len(rows) * max(lengths[r] for r in rows) for rows in rows_per_forward if rows)
