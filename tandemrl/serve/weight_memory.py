"""How many bytes of the served weights this process's own memory holds: the number that shows whether a sync
mode keeps a second copy of the weights (checkpoint, lora, nccl: yes; ipc: no, the weights are mapped from the
trainer's allocation and this process holds none of them).

On CUDA a parameter is this process's own when its memory lies inside a segment of PyTorch's caching allocator
(memory opened from another process's IPC handle does not); on the CPU every parameter is.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def bytes_inside(tensors: Iterable[tuple[int, int]], segments: Iterable[tuple[int, int]]) -> int:
    """Sum of the sizes of the ``(address, bytes)`` tensors that lie inside one of the ``(address, bytes)``
    segments."""
    spans = list(segments)
    total = 0
    for address, size in tensors:
        if any(start <= address and address + size <= start + length for start, length in spans):
            total += size
    return total


def owned_weight_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters (each once: tied weights count once) held by this process."""
    def size(p: nn.Parameter) -> int:
        return p.numel() * p.element_size()

    params = list(model.parameters())
    cuda = [p for p in params if p.is_cuda]
    owned = sum(size(p) for p in params if not p.is_cuda)
    if cuda:
        devices = {p.device.index for p in cuda}
        segments = [(s["address"], s["total_size"]) for s in torch.cuda.memory_snapshot() if s["device"] in devices]
        owned += bytes_inside([(p.data_ptr(), size(p)) for p in cuda], segments)
    return owned
