"""A low-latency all-reduce for the tensor-parallel engine's decode-size tensors: PyTorch's symmetric memory.

NCCL's all-reduce costs some 15-20 us even for a few kilobytes, twice per layer of every decode step. Here each rank
allocates one buffer with ``torch.distributed._symmetric_memory`` (its peers map it over NVLink), copies its partial
sums into it and runs ``torch.ops.symm_mem.one_shot_all_reduce_out``: one kernel in which every rank reads its peers'
buffers directly and sums them, in rank order, so every rank gets the same bits. No multicast (multimem) op is used.

CUDA graphs: the kernel's barrier is a per-block flag on each peer's signal pad, set 0 -> 1 by the sender and reset
1 -> 0 by the receiver, so every call leaves the pads as it found them and a captured call replays safely (every
rank replays the same kernels in the same order, as the engine's ranks do). The kernel ends with that barrier, so the
next call may overwrite the buffer. The one_shot_all_reduce_copy ops (copy fused into the kernel) are not used: their
copy loop is not followed by __syncthreads() before the barrier (torch 2.11), so we copy in a kernel of our own.

A tensor larger than the buffer (prefill), of another dtype, or a group that is not NCCL over one host falls back to
``dist.all_reduce``. ``engine.tp_all_reduce`` chooses.
"""

from __future__ import annotations

import socket
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.engine.config import TP_ALL_REDUCES

KEY = "engine.tp_all_reduce"
# One-shot: each rank reads (ranks - 1) buffers. At 2 ranks 8 MiB covers a decode step of 256 sequences at hidden
# 8192 in bf16 (vLLM's custom all-reduce stays one-shot up to 8 MB at 2 GPUs); more ranks read more, so less.
PEER_READ_BYTES = 8 * 2**20


@dataclass
class SymmetricAllReduce:
    """In-place sum over the group of a tensor that fits ``buffer`` (a flat symmetric-memory tensor, rendezvoused)."""

    buffer: Tensor
    group_name: str

    def fits(self, x: Tensor) -> bool:
        return (x.device == self.buffer.device and x.dtype == self.buffer.dtype and x.is_contiguous()
                and x.numel() <= self.buffer.numel() and x.data_ptr() % 16 == 0  # the kernel's vector stores
                and x.numel() * x.element_size() % 4 == 0)

    def __call__(self, x: Tensor) -> Tensor:
        flat = x.view(-1)
        staged = self.buffer[:flat.numel()]
        staged.copy_(flat)
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, flat)
        return x


def symmetric_all_reduce(choice: str, group, device: torch.device, dtype: torch.dtype) -> SymmetricAllReduce | None:
    """Collective over ``group`` (None: the default group): the symmetric-memory all-reduce that ``choice`` (the value
    of ``engine.tp_all_reduce``) asks for, or None for NCCL. ``symmetric`` where it cannot work: ValueError naming
    the key; ``auto`` there: None."""
    if choice not in TP_ALL_REDUCES:
        raise ValueError(f"{KEY} must be one of {list(TP_ALL_REDUCES)}, got {choice!r}")
    if choice == "nccl":
        return None
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    why_not = _unavailable(group, device)
    if why_not:
        if choice == "symmetric":
            raise ValueError(f"{KEY} = 'symmetric' needs {why_not}; set {KEY} = 'auto' or 'nccl'")
        return None
    import torch.distributed._symmetric_memory as symm_mem

    size = dist.get_world_size(group)
    numel = PEER_READ_BYTES // (size - 1) // dtype.itemsize // 16 * 16  # whole 16-element units
    buffer = symm_mem.empty(numel, dtype=dtype, device=device)
    with warnings.catch_warnings():  # deprecated (not needed) in newer torch, needed in older
        warnings.simplefilter("ignore")
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(group.group_name)
    symm_mem.rendezvous(buffer, group.group_name)  # a name: older torch takes no group object
    return SymmetricAllReduce(buffer, group.group_name)


def _unavailable(group, device: torch.device) -> str:
    """Why symmetric memory cannot serve ``group`` ('' if it can); the same answer on every rank."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    if device.type != "cuda" or "nccl" not in backend:
        return f"CUDA devices and an NCCL group (this one: {backend} on {device.type})"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
        return f"torch.ops.symm_mem.one_shot_all_reduce_out (not in torch {torch.__version__})"
    hosts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) > 1:
        return f"every rank of the engine's group on one host (these span {sorted(set(hosts))})"
    return ""
