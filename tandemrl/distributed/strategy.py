"""Replicate or shard: a full copy of the model per rank when it fits the device with its training state, FSDP2
shards when it does not.

Replication is the faster choice whenever it fits: one all-reduce of the gradients per optimizer step (no per-layer
all-gather in every forward and backward, no reduce-scatter per micro-batch) and the engine decodes the trained
tensors in place, as on one GPU (no replica, no gather after the update).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# AdamW keeps two moments per trainable weight, in the weight's dtype (torch.optim.AdamW's exp_avg, exp_avg_sq).
ADAM_STATES = 2
# Of the device's memory, what the model's training state may take; the rest is for activations, the engine's KV
# cache, the allocator's fragmentation and CUDA's own context.
STATE_SHARE = 0.65


@dataclass(frozen=True)
class Choice:
    strategy: str  # "replicate" | "shard"
    reason: str  # one line, said by rank 0 at the start


def training_state_bytes(model: nn.Module, extra_copies: int = 0) -> int:
    """Weights (plus ``extra_copies`` frozen copies: a reference model) + gradients and AdamW moments of the
    trainable weights, as one rank holds them when replicated."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights * (1 + extra_copies) + trainable * (1 + ADAM_STATES)


def device_bytes(device: torch.device) -> int | None:
    """The GPU's memory; None on the CPU (host memory is not the limit a GPU run is sized by)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def choose_strategy(asked: str, model: nn.Module, device: torch.device, lora: bool, extra_copies: int = 0) -> Choice:
    """``asked``: distributed.strategy, for ``model`` on ``device``."""
    return decide(asked, training_state_bytes(model, extra_copies), device_bytes(device), lora)


def decide(asked: str, need: int, total: int | None, lora: bool) -> Choice:
    """``need``: training_state_bytes; ``total``: the GPU's bytes (None: the CPU). LoRA always replicates (the
    adapter is small; the frozen base is not sharded)."""
    if lora:
        if asked == "shard":
            raise ValueError("distributed.strategy = 'shard' does not take model.lora.enabled: LoRA replicates (each "
                             "rank holds the base and the adapter); use 'auto' or 'replicate'")
        return Choice("replicate", "LoRA: each rank holds the frozen base and the adapter, adapter gradients "
                                   "all-reduced")
    if asked != "auto":
        return Choice(asked, f"distributed.strategy = {asked!r}")
    if total is None:
        return Choice("replicate", f"auto: on the CPU ({need / 2**30:.2f} GiB of weights, gradients and AdamW "
                                   "states per rank)")
    budget = STATE_SHARE * total
    verdict = "replicate" if need <= budget else "shard"
    sign = "<=" if verdict == "replicate" else ">"
    return Choice(verdict, f"auto: weights, gradients and AdamW states {need / 2**30:.1f} GiB {sign} "
                           f"{STATE_SHARE:.0%} of the GPU's {total / 2**30:.0f} GiB")
