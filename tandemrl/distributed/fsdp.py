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
from typing import Any

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


def shard_model(model: nn.Module) -> None:
    """FSDP2 over each decoder layer, then the root (embeddings, final norm, lm_head: tied weights stay together).

    FSDP averages the gradients over ranks; each rank's loss is normalised by the global normalisers divided by the
    world size (Parallel.global_norm), so that average is the gradient of the global loss.
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from tandemrl.train.logprobs import FSDP_FORWARD

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    # The trainer's log-prob pass calls the decoder and reads lm_head.weight directly (chunked, without full
    # logits); as a registered forward method of the root it runs between FSDP's gather and its gradient hooks.
    setattr(model, FSDP_FORWARD, types.MethodType(_sharded_logprobs, model))
    register_fsdp_forward_method(model, FSDP_FORWARD)


def _sharded_logprobs(model: nn.Module, batch: Any, temperature: float, chunk_size: int) -> Any:
    from tandemrl.train.logprobs import TokenLogprobs, logprobs_of

    out = logprobs_of(model, batch, temperature, chunk_size)
    # FSDP hooks its backward onto the outputs: fresh tensors, not views (an in-place op on a view drops the hook)
    return TokenLogprobs(out.logprobs.clone(), out.entropy)


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
