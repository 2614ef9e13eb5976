"""Model slots on different devices (e.g. tandem's frozen model on ``cuda:1`` or on the CPU beside a hot model on
``cuda:0``): each slot computes on its own device and only small tensors cross (token ids in, sampled tokens out).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import Tensor

from tandemrl.engine.model.pending import copy_to_device

CPU_KV_BUDGET_BYTES = 256 * 1024 * 1024
# Kept free on the GPU beside the cache: the sampler's [rows, vocab] float32 temporaries for a full decode batch
# (about a dozen of them, sort indices included) plus a fixed slack for prefill activations and graph pools.
_SAMPLER_ROWS, _SAMPLER_TEMPS, _SLACK_BYTES = 256, 12, 512 * 1024 * 1024


def canonical(device: torch.device | str) -> torch.device:
    """``cuda`` -> ``cuda:<current>``, so devices compare equal when they are the same."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def move(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``, the device streams kept ordered without a host sync where possible. Between two GPUs
    ATen's device-to-device copy already makes the two current streams wait for each other (a two-way event
    barrier), so ``non_blocking=True`` is enough; CPU -> GPU goes through pinned memory; GPU -> CPU waits for the GPU,
    since the CPU reads the values at once (the one host sync of this placement, per hand-over)."""
    if tensor.device == device:
        return tensor
    if tensor.device.type == "cpu":
        return copy_to_device(tensor, device)
    return tensor.to(device, non_blocking=device.type == "cuda")  # to the host: waits (the host computes with it next)


def on_device(device: torch.device, home: torch.device) -> ContextManager:
    """``device`` as the current CUDA device for work launched inside (Triton kernels, graph captures and events use
    the current device, not the tensors'); nothing when it is ``home`` (current already) or not a GPU."""
    return contextlib.nullcontext() if device == home or device.type != "cuda" else torch.cuda.device(device)


def kv_budget(device: torch.device, gpu_memory_utilization: float, vocab: int) -> float:
    """Bytes the KV pools may take on ``device``. CUDA: a ``gpu_memory_utilization`` share of its memory, bounded by
    what is free now (the trainer's tensors stay where they are) minus room for activations; CPU: 256 MiB. The runner
    takes the smallest count of blocks over its devices: every slot holds the same block ids."""
    if device.type != "cuda":
        return CPU_KV_BUDGET_BYTES
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    reserve = _SAMPLER_ROWS * _SAMPLER_TEMPS * vocab * 4 + _SLACK_BYTES
    return min(gpu_memory_utilization * total, free - reserve)
