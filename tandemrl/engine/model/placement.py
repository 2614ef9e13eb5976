"""Model slots on different devices (e.g. tandem's frozen model on ``cuda:1`` or on the CPU beside a hot model on
``cuda:0``): each slot computes on its own device and only small tensors cross (token ids in, sampled tokens out).

- ``move``: a cross-device copy that keeps the device streams ordered without a host sync where that is possible.
  Between two GPUs PyTorch's copy already makes the two devices' current streams wait for each other (a two-way
  event barrier in ATen's device-to-device copy), so ``non_blocking=True`` is enough; CPU -> GPU goes through
  pinned memory (pending.py's ``copy_to_device``); GPU -> CPU waits for the GPU, since the CPU reads the values at
  once (the one host sync of this placement, per hand-over).
- ``on_device``: makes a slot's device the current CUDA device while its work is launched: Triton kernels, CUDA
  graph captures and events use the current device, not the tensors'.
- ``canonical``: ``cuda`` -> ``cuda:<current>``, so devices compare equal when they are the same.
- ``kv_budget``: the bytes a device gives the KV pools of the slots on it (the runner takes the smallest count of
  blocks over its devices: every slot holds the same block ids).
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
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def move(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device`` (itself when it is there already); see the module docstring for the syncs."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda":
        if tensor.device.type == "cpu":
            return copy_to_device(tensor, device)
        return tensor.to(device, non_blocking=True)
    return tensor.to(device)  # to the host: waits for the device (the host computes with it next)


def on_device(device: torch.device, home: torch.device) -> ContextManager:
    """``device`` as the current CUDA device for work launched inside; nothing when it is ``home`` (the runner's
    device, current already) or not a GPU."""
    if device == home or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def kv_budget(device: torch.device, gpu_memory_utilization: float, vocab: int) -> float:
    """Bytes the KV pools may take on ``device``. CUDA: a ``gpu_memory_utilization`` share of its memory, bounded by
    what is free now (the trainer's tensors stay where they are) minus room for activations; CPU: 256 MiB."""
    if device.type != "cuda":
        return CPU_KV_BUDGET_BYTES
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    reserve = _SAMPLER_ROWS * _SAMPLER_TEMPS * vocab * 4 + _SLACK_BYTES
    return min(gpu_memory_utilization * total, free - reserve)
