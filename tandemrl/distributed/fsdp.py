"""FSDP2 sharding of the policy, and the engine's full-weight replica refreshed from the shards after each update.

Why a replica: after ``fully_shard`` every parameter is a DTensor holding 1/N of the tensor, while the rollout engine
reads plain full tensors in place (and captures them in CUDA graphs). So each rank keeps one plain copy of the model
for its engine and, after every optimizer step, all-gathers the shards parameter by parameter straight into that
copy's existing tensors (``copy_``: the engine's pointers and graphs stay valid). Per GPU this is one full copy
(the replica) plus 1/N of the weights, gradients and optimizer state; the gather needs one extra full tensor at a
time, never a second copy of the model.
"""

from __future__ import annotations

import copy
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face decoder (model.model.layers and its usual relatives)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard (looked for "
                         "get_decoder().layers and .h)")
    return list(layers)


def fully_shard_decoder(model: nn.Module, forward_methods: Mapping[str, Callable[..., Any]]) -> None:
    """FSDP2 over each decoder layer, then the root (embeddings, final norm, lm_head: tied weights stay together).

    ``forward_methods``: name -> function(model, ...), bound on the root and registered as FSDP forward methods, so
    each runs between FSDP's gather of the root's shards and its gradient hooks (the trainer's log-prob pass:
    train/sharding.py). FSDP averages the gradients over ranks; each rank's loss is normalised by the global
    normalisers divided by the world size (Parallel.global_norm), so that average is the gradient of the global loss.
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    for name, method in forward_methods.items():
        setattr(model, name, types.MethodType(method, model))
        register_fsdp_forward_method(model, name)


def plain_replica(model: nn.Module) -> nn.Module:
    """A frozen full copy for the engine; take it before ``shard_model`` (it then holds the starting weights)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


@dataclass
class WeightGather:
    """Copies the sharded model's full weights into the replica's own tensors, in place."""

    sharded: nn.Module
    replica: nn.Module

    def __post_init__(self) -> None:
        targets = dict(self.replica.named_parameters())
        sources = dict(self.sharded.named_parameters())
        if sorted(targets) != sorted(sources):
            missing = sorted(set(sources) ^ set(targets))[:5]
            raise ValueError(f"the engine replica and the sharded model differ in parameters: {missing}")
        self._pairs = [(sources[name], targets[name]) for name in sources]

    @torch.no_grad()
    def refresh(self) -> float:
        """All-gather every parameter into the replica; returns the seconds it took (device work included)."""
        from torch.distributed.tensor import DTensor

        start = time.perf_counter()
        for source, target in self._pairs:
            full = source.full_tensor() if isinstance(source, DTensor) else source
            target.copy_(full)
            del full  # one gathered tensor alive at a time
        if any(t.is_cuda for _, t in self._pairs[:1]):
            torch.cuda.synchronize()
        return time.perf_counter() - start
