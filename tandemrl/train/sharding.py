"""The trainer's model under torchrun: replicated (a full copy per rank, gradients all-reduced once per optimizer
step; distributed/replicate.py) or sharded with FSDP2 (distributed/fsdp.py), as distributed.strategy chooses
(distributed/strategy.py).

Sharded, the log-prob pass (logprobs.py) becomes a forward method of the root. It calls the decoder and reads
lm_head.weight directly (chunked, without full logits); as a registered forward method it runs between FSDP's gather
and its gradient hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from tandemrl.distributed.fsdp import fully_shard_decoder
from tandemrl.distributed.strategy import Choice, choose_strategy
from tandemrl.train.batch import TrainBatch
from tandemrl.train.logprobs import FSDP_FORWARD, TokenLogprobs, logprobs_of


@dataclass
class RankModel:
    """What a rank trains and decodes with: ``engine_model`` is the trained model itself when replicated, a full
    replica when sharded (``engine_weights.refresh()`` copies the new weights into it after each update), or the
    sharded model itself when no engine of this rank decodes (rollout.backend = "server")."""

    choice: Choice
    engine_model: nn.Module
    engine_weights: Any  # WeightGather | NoGather | TensorParallelWeights
    reduce_gradients: Callable[[], None] | None  # replicated: called once per optimizer step (train/update.py)
    tensor_parallel: Any = None  # engine.tensor_parallel_size > 1: this rank's TensorParallelGroup


def distribute_model(model: nn.Module, asked: str, world_size: int, device: torch.device, lora: bool,
                     extra_copies: int = 0, tensor_parallel_size: int = 1, engine_replica: bool = True) -> RankModel:
    """Collective: every rank calls it. Replicates or shards ``model`` in place (the ranks agree: one rank that
    cannot replicate makes all shard). ``tensor_parallel_size`` > 1: the engine decodes this rank's tensor-parallel
    shard, refreshed slice by slice from the trained model (distributed/tp_weights.py). ``engine_replica`` False: no
    engine here (a separate server samples), so a sharded model gets no full replica."""
    choice = agreed(choose_strategy(asked, model, device, lora, extra_copies), device)
    if tensor_parallel_size > 1:
        return _tensor_parallel_engine(model, choice, world_size, tensor_parallel_size)
    if choice.strategy == "replicate":
        from tandemrl.distributed.replicate import GradientAllReduce, NoGather, broadcast_trainable

        broadcast_trainable(model)
        return RankModel(choice, model, NoGather(), GradientAllReduce.of(model, world_size))
    from tandemrl.distributed.fsdp import WeightGather, plain_replica

    if not engine_replica:
        from tandemrl.distributed.replicate import NoGather

        shard_model(model)
        return RankModel(choice, model, NoGather(), None)
    replica = plain_replica(model)  # before sharding: it starts with the full weights
    shard_model(model)
    return RankModel(choice, replica, WeightGather(model, replica), None)


def _tensor_parallel_engine(model: nn.Module, choice: Choice, world_size: int, size: int) -> RankModel:
    """Train as ``choice`` says; the engine's shard starts from the trained weights (sharded: from the FSDP2 shards,
    no rank ever holding a whole replica)."""
    import torch.distributed as dist

    from tandemrl.distributed.tp_weights import TensorParallelWeights, tensor_parallel_group
    from tandemrl.models.tensor_parallel import empty_shard

    reduce_gradients = None
    if choice.strategy == "replicate":
        from tandemrl.distributed.replicate import GradientAllReduce, broadcast_trainable

        broadcast_trainable(model)
        reduce_gradients = GradientAllReduce.of(model, world_size)
    else:
        shard_model(model)
    group = tensor_parallel_group(dist.get_rank(), world_size, size)
    engine = empty_shard(model, group)
    weights = TensorParallelWeights(model, engine, size)
    weights.refresh()
    return RankModel(choice, engine, weights, reduce_gradients, group)


def agreed(choice: Choice, device: torch.device) -> Choice:
    import torch.distributed as dist

    replicate = torch.tensor([int(choice.strategy == "replicate")], device=device)
    dist.all_reduce(replicate, op=dist.ReduceOp.MIN)
    if choice.strategy == "replicate" and not replicate.item():
        return Choice("shard", f"{choice.reason} here, but another rank's GPU is smaller")
    return choice


def shard_model(model: nn.Module) -> None:
    """FSDP2 over the decoder layers and the root, with the trainer's log-prob pass as the root's forward method."""
    fully_shard_decoder(model, {FSDP_FORWARD: _sharded_logprobs})


def _sharded_logprobs(model: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int) -> TokenLogprobs:
    out = logprobs_of(model, batch, temperature, chunk_size)
    # FSDP hooks its backward onto the outputs: fresh tensors, not views (an in-place op on a view drops the hook)
    return TokenLogprobs(out.logprobs.clone(), out.entropy)
