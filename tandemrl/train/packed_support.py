"""Does a model's attention take packed input? If not, the update falls back to padded rows, and says so once.

transformers' own decoders build their attention mask with masking_utils.create_causal_mask, which reads restarting
``position_ids`` (with no ``attention_mask``) as packed sequences for every attention implementation: flash-attention
through cu_seqlens, flex_attention through a document BlockMask, sdpa/eager through a block-diagonal mask, and
tandemrl's ``varlen`` (models/varlen_attention.py) through the rows' offsets, handed to the forward. Models from
elsewhere (``trust_remote_code``) may attend across the packed rows: they get padded rows (and ``varlen``, which
exists to pack, is refused for them).
"""

from __future__ import annotations

import sys
import warnings

from torch import nn

from tandemrl.models.varlen_attention import VARLEN
from tandemrl.models.varlen_kernel import KEY, VarlenAttentionError
from tandemrl.train.batch import TrainBatch

_VERDICT = "_tandemrl_packs_sequences"  # kept on the model, so the fallback is said once per model
_DENSE_MASK_IMPLEMENTATIONS = ("sdpa", "eager")
ALWAYS_PACK = "_tandemrl_always_pack"  # set True on a model to pack whatever the cost (the equivalence tests do)


def packed_is_cheaper(causal_lm: nn.Module, batch: TrainBatch) -> bool:
    """Whether this micro-batch runs packed. A dense-mask attention (sdpa, eager) computes every [tokens x tokens]
    pair of the packed sequence, so it packs only when that costs no more than the padded rows' attention
    (rows x width^2): short rows (the CPU demo's 13-token rows, 128 of them) stay padded, long-tailed ones pack."""
    if always_packs(causal_lm):
        return True
    if not packs_sequences(causal_lm):
        return False
    tokens = int(batch.attention_mask.sum())
    rows, width = batch.input_ids.shape
    return tokens * tokens <= rows * width * width


def always_packs(causal_lm: nn.Module) -> bool:
    """Whether every micro-batch runs packed; if not, some may run on padded rows (rows x width positions), which
    is what the micro-batch planner must then bound (train/micro_batches.py)."""
    if not packs_sequences(causal_lm):
        return False
    return bool(getattr(causal_lm, ALWAYS_PACK, False)) or _implementation(causal_lm) not in _DENSE_MASK_IMPLEMENTATIONS


def takes_offsets(causal_lm: nn.Module) -> bool:
    """Whether the packed forward is handed the rows' offsets (cu_seq_lens_q/k, max_length_q/k)."""
    return _implementation(causal_lm) == VARLEN


def packs_sequences(causal_lm: nn.Module) -> bool:
    known = getattr(causal_lm, _VERDICT, None)
    if known is None:
        known = _masks_packed_positions(type(causal_lm.get_decoder()))
        if not known and takes_offsets(causal_lm):
            raise VarlenAttentionError(f"{KEY} attends over packed sequences, and {type(causal_lm).__name__} is not "
                                       "a transformers decoder whose attention takes them: use 'sdpa'")
        setattr(causal_lm, _VERDICT, known)
        _say_once(causal_lm, known)
    return known


def _masks_packed_positions(decoder_class: type) -> bool:
    """A transformers model class (FSDP and peft wrap it in subclasses) whose module builds masks from positions."""
    for cls in decoder_class.__mro__:
        if cls.__module__.startswith("transformers.models."):
            module = sys.modules.get(cls.__module__)
            return bool(getattr(cls, "_supports_attention_backend", False)) and hasattr(module, "create_causal_mask")
    return False


def _say_once(causal_lm: nn.Module, packs: bool) -> None:
    implementation = _implementation(causal_lm)
    if not packs:
        warnings.warn(f"{type(causal_lm).__name__} is not a transformers decoder that confines attention to packed "
                      "sequences: the update runs on padded rows (slower on long-tailed lengths)", stacklevel=3)
    elif implementation in _DENSE_MASK_IMPLEMENTATIONS and causal_lm.get_input_embeddings().weight.is_cuda:
        warnings.warn(f"packed update with attn_implementation={implementation!r}: attention is confined by a dense "
                      "[tokens x tokens] mask per micro-batch; model.attn_implementation = 'varlen' or "
                      "'flex_attention' (or 'flash_attention_2' where installed) skips the masked blocks", stacklevel=3)


def _implementation(causal_lm: nn.Module) -> str | None:
    return getattr(causal_lm.config, "_attn_implementation", None)
