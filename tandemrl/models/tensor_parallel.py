"""Tensor parallelism as a model transformation: one rank's shard of a decoder, run by the unchanged engine.

A group of N ranks runs one engine. Each rank holds a Hugging Face model of the same class built from a config with
1/N of the attention heads, KV heads and MLP columns (so ``inspect_decoder``, the KV pool and the CUDA graphs see
local shapes and stay the one path), with four modules swapped:

- q/k/v and gate/up stay plain ``nn.Linear`` (column-parallel: their weight rows are this rank's heads / columns);
- o_proj and down_proj become ``RowParallelLinear`` (their weight columns, then one all-reduce; a bias is added once,
  after it);
- embed_tokens becomes ``VocabParallelEmbedding`` (this rank's rows of the vocabulary, zeros for the others' ids,
  one all-reduce) and lm_head ``VocabParallelLMHead`` (this rank's vocabulary rows, the logits all-gathered so the
  sampler sees the whole vocabulary). A tied lm_head shares the embedding's shard, as the full model shares its
  weight. The vocabulary is split in ceil(V / N)-row shards; the last rank's padding rows are zero and cut off.

KV heads fewer than N (e.g. 1 KV head over 2 ranks) are replicated: each rank keeps the one KV head its query heads
read (N must be a multiple of the KV heads). Norms, RoPE and biases of row-parallel layers are whole on every rank.
The collectives are torch.distributed's in-place all_reduce and all-gather (NCCL captures them in CUDA graphs).

Every rank of the group computes the same hidden states and logits bit for bit (the collectives hand every rank the
same sums), so the same seeded sampler draws the same tokens on each: the ranks' schedulers stay in step without
exchanging tokens. ``param_slice`` says which slice of each full parameter a rank holds: the engine fills a shard
from a full model here (``shard_for_rank``), the trainer from FSDP2 shards (distributed/tp_weights.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tandemrl.models.unwrap import unwrap_causal_lm

KEY = "engine.tensor_parallel_size"
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # weight (and bias) rows split
ROW_PARALLEL = ("o_proj", "down_proj")  # weight columns split
VOCAB_PARALLEL = ("embed_tokens", "lm_head")  # weight rows split


@dataclass(frozen=True)
class TensorParallelGroup:
    """This rank's place in its tensor-parallel group, and the group's collectives (``group`` None: the default
    process group)."""

    rank: int
    size: int
    group: Any = None

    def all_reduce_(self, x: Tensor) -> Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_rows(self, x: Tensor) -> Tensor:
        """[S, ...] on every rank -> [size, S, ...], rank r's rows at [r]."""
        out = x.new_empty((self.size, *x.shape))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
        gather(out.view(-1, *x.shape[1:]), x.contiguous(), group=self.group)
        return out

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest ``value`` over the group (e.g. KV blocks: every rank's scheduler must see the same pool)."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


@dataclass(frozen=True)
class ShardSizes:
    """The full model's sizes and one rank's share of them."""

    heads: int  # query heads per rank
    kv_heads: int  # KV heads per rank (1 when replicated)
    head_dim: int
    intermediate: int  # MLP columns per rank
    vocab: int  # the full vocabulary
    vocab_rows: int  # vocabulary rows per rank: ceil(vocab / size)
    kv_replicas: int  # ranks that hold the same KV head (1: KV heads split)


def shard_sizes(config: Any, size: int) -> ShardSizes:
    """ValueError naming ``engine.tensor_parallel_size`` when the model's heads or MLP do not split ``size`` ways."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    intermediate = int(config.intermediate_size)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if heads % size or intermediate % size:
        raise ValueError(f"{KEY} = {size} must divide the model's attention heads ({heads}) and MLP size "
                         f"({intermediate})")
    if kv % size and size % kv:
        raise ValueError(f"{KEY} = {size} must divide the model's {kv} KV heads, or be a multiple of them (each KV "
                         "head then replicated on size / KV heads ranks)")
    vocab = int(config.vocab_size)
    return ShardSizes(heads=heads // size, kv_heads=max(kv // size, 1), head_dim=head_dim,
                      intermediate=intermediate // size, vocab=vocab, vocab_rows=-(-vocab // size),
                      kv_replicas=max(size // kv, 1))


@dataclass(frozen=True)
class ParamSlice:
    """Rank's share of one full parameter: rows (dim 0) or columns (dim 1) start:stop; dim None: the whole tensor."""

    dim: int | None
    start: int = 0
    stop: int = 0


def param_slice(name: str, sizes: ShardSizes, rank: int) -> ParamSlice:
    """What rank ``rank`` holds of the full model's parameter ``name`` (its name in the shard model too)."""
    module, kind = (["", *name.split(".")])[-2:]
    if module in ("k_proj", "v_proj"):  # a replicated KV head: the one this rank's query heads read
        rows = sizes.kv_heads * sizes.head_dim
        first = rank // sizes.kv_replicas * rows
        return ParamSlice(0, first, first + rows)
    if module in COLUMN_PARALLEL or (module in ROW_PARALLEL and kind == "weight"):
        width = sizes.heads * sizes.head_dim if module in ("q_proj", "o_proj") else sizes.intermediate
        return ParamSlice(1 if module in ROW_PARALLEL else 0, rank * width, (rank + 1) * width)
    if module in VOCAB_PARALLEL and kind == "weight":  # the last shard may end in padding rows
        start = rank * sizes.vocab_rows
        return ParamSlice(0, min(start, sizes.vocab), min(start + sizes.vocab_rows, sizes.vocab))
    return ParamSlice(None)  # norms, RoPE, the biases of row-parallel layers: whole


def take_slice(full: Tensor, piece: ParamSlice) -> Tensor:
    return full if piece.dim is None else full.narrow(piece.dim, piece.start, piece.stop - piece.start)


def target_view(shard_param: Tensor, piece: ParamSlice) -> Tensor:
    """Where the slice lands in the shard's tensor (a vocabulary shard past the vocabulary's end is padding)."""
    return shard_param if piece.dim is None else shard_param.narrow(piece.dim, 0, piece.stop - piece.start)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x @ W_local^T) + b: this rank's input columns of a Linear; the bias whole, added once."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.tp = tp

    def forward(self, x: Tensor) -> Tensor:
        y = self.tp.all_reduce_(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """This rank's ``rows`` of the embedding (from id ``rank * rows``): ids elsewhere look up zeros, one all-reduce
    sums the ranks' rows. ``num_embeddings`` is the whole vocabulary, as nn.Embedding's (inspect_decoder reads it)."""

    def __init__(self, vocab: int, rows: int, hidden: int, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden), requires_grad=False)
        self.num_embeddings, self.rows, self.first, self.tp = vocab, rows, tp.rank * rows, tp

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.first
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.clamp(0, self.rows - 1), self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce_(out)


class VocabParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary rows, all-gathered into [S, vocab] (the padding rows cut off)."""

    def __init__(self, weight: nn.Parameter, vocab: int, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.weight, self.vocab, self.tp = weight, vocab, tp

    def forward(self, hidden: Tensor) -> Tensor:
        parts = self.tp.all_gather_rows(F.linear(hidden, self.weight))  # [size, S, rows]
        return parts.permute(1, 0, 2).reshape(hidden.shape[0], -1)[:, :self.vocab]


def empty_shard(model: nn.Module, tp: TensorParallelGroup) -> nn.Module:
    """Rank ``tp.rank``'s shard of ``model`` (a plain HF decoder; its parameters may be FSDP2 DTensors), frozen, in
    eval mode, its weights allocated but not filled (``shard_for_rank`` or distributed/tp_weights.py fill them).
    Never materialises a full layer: the shard is built on the meta device, then allocated."""
    lm = unwrap_causal_lm(model)
    if lm is not model or any("lora" in name for name, _ in model.named_modules()):
        raise ValueError(f"{KEY} > 1 takes a plain Hugging Face decoder (no LoRA adapter, no wrapper): the engine's "
                         "shard is built from its config and fed slices of its weights")
    sizes = shard_sizes(lm.config, tp.size)
    source = next(lm.parameters())  # the shard lives where the model does, in its dtype
    config = copy.deepcopy(lm.config)
    config.num_attention_heads, config.num_key_value_heads = sizes.heads, sizes.kv_heads
    config.intermediate_size, config.head_dim = sizes.intermediate, sizes.head_dim
    with torch.device("meta"):
        shard = _model_class(lm)(config)
        _swap_parallel_modules(shard, lm, sizes, tp)
        shard = shard.to(source.dtype)  # after the swap: the parallel modules are built in the default dtype
    shard = shard.to_empty(device=source.device).eval().requires_grad_(False)
    if _tied(lm):  # to_empty gave each module a parameter of its own
        shard.lm_head.weight = shard.model.embed_tokens.weight
    shard.shard_sizes = sizes  # the full model's slicing, for whoever fills the weights (shard_params)
    shard.generation_config = copy.deepcopy(lm.generation_config)  # its eos ids are the engine's
    with torch.no_grad():
        for p in shard.parameters():
            p.zero_()  # the vocabulary's padding rows stay zero (their logits are cut off after the gather)
    buffers = dict(lm.named_buffers())
    for name, buffer in shard.named_buffers():  # RoPE's inverse frequencies: the head size did not change
        buffer.copy_(buffers[name])
    return shard


def _model_class(lm: nn.Module) -> type:
    """The Hugging Face class of ``lm`` (FSDP2's fully_shard swaps in a subclass of it and FSDPModule)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(lm).__mro__ if not issubclass(c, FSDPModule))


def _swap_parallel_modules(shard: nn.Module, full: nn.Module, sizes: ShardSizes, tp: TensorParallelGroup) -> None:
    hidden = int(full.config.hidden_size)
    for layer in shard.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.o_proj = RowParallelLinear(sizes.heads * sizes.head_dim, hidden, attn.o_proj.bias is not None, tp)
        mlp.down_proj = RowParallelLinear(sizes.intermediate, hidden, mlp.down_proj.bias is not None, tp)
    tied = _tied(full)
    embed = VocabParallelEmbedding(sizes.vocab, sizes.vocab_rows, hidden, tp)
    shard.model.embed_tokens = embed
    head_weight = embed.weight if tied else nn.Parameter(torch.empty(sizes.vocab_rows, hidden), requires_grad=False)
    shard.lm_head = VocabParallelLMHead(head_weight, sizes.vocab, tp)


def _tied(lm: nn.Module) -> bool:
    return lm.get_output_embeddings().weight is lm.get_input_embeddings().weight


def is_shard(model: nn.Module) -> bool:
    """Whether ``model`` is one rank's tensor-parallel shard (built by ``empty_shard``)."""
    return isinstance(getattr(model, "shard_sizes", None), ShardSizes)


def shard_params(shard: nn.Module, rank: int) -> list[tuple[str, Tensor, ParamSlice]]:
    """(name, the shard's tensor, the slice of the full parameter it holds) for every parameter of ``shard`` (built
    by ``empty_shard``), as rank ``rank`` of its group holds it (tied parameters once)."""
    sizes: ShardSizes = shard.shard_sizes
    return [(name, p, param_slice(name, sizes, rank)) for name, p in shard.named_parameters()]


@torch.no_grad()
def shard_for_rank(model: nn.Module, tp: TensorParallelGroup) -> nn.Module:
    """Rank ``tp.rank``'s shard of a full model held whole on this rank (an engine of its own, tandem's frozen
    model): built, then filled from ``model``'s tensors (no communication)."""
    shard = empty_shard(model, tp)
    sources = dict(unwrap_causal_lm(model).named_parameters())
    for name, target, piece in shard_params(shard, tp.rank):
        target_view(target, piece).copy_(take_slice(sources[name], piece))
    return shard
