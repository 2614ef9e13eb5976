"""Replicated training: every rank holds the whole model; gradients are averaged over ranks once per optimizer step.

Not DDP: DDP reduces inside hooks armed by its own ``forward``, while the trainer's log-prob pass calls the decoder
directly (train/logprobs.py), and it reduces on every backward unless each micro-batch but the last runs under
``no_sync``. An explicit all-reduce after the last micro-batch's backward does the same arithmetic with one call
site, in buckets (a few hundred NCCL calls become a few dozen, the transient memory one bucket per call in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

BUCKET_BYTES = 64 * 2**20
IN_FLIGHT = 2  # buckets reduced at once: the next one is flattened while the last one is on the wire


@dataclass
class GradientAllReduce:
    """Averages the gradients of ``params`` over the ranks (each rank's loss is normalised by the global
    normalisers divided by the world size: Parallel.global_norm; so the average is the global loss's gradient)."""

    params: list[nn.Parameter]
    world_size: int
    bucket_bytes: int = BUCKET_BYTES
    _pending: list = field(default_factory=list, init=False, repr=False)

    @classmethod
    def of(cls, model: nn.Module, world_size: int) -> GradientAllReduce:
        return cls([p for p in model.parameters() if p.requires_grad], world_size)

    @torch.no_grad()
    def __call__(self) -> None:
        import torch.distributed as dist

        for p in self.params:  # a weight this rank's rows did not reach: its zero gradient still takes part
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for grads in buckets([p.grad for p in self.params], self.bucket_bytes):
            flat = torch.cat([g.reshape(-1) for g in grads])
            self._pending.append((dist.all_reduce(flat, async_op=True), flat, grads))
            if len(self._pending) >= IN_FLIGHT:
                self._finish(self._pending.pop(0))
        while self._pending:
            self._finish(self._pending.pop(0))

    def _finish(self, pending: tuple) -> None:
        work, flat, grads = pending
        work.wait()
        flat.div_(self.world_size)  # gloo has no AVG: sum, then divide
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of one dtype and device, each up to ``limit`` bytes (a larger tensor alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        bytes_ = t.numel() * t.element_size()
        same_kind = out and out[-1][0].dtype == t.dtype and out[-1][0].device == t.device
        if same_kind and size + bytes_ <= limit:
            out[-1].append(t)
            size += bytes_
        else:
            out.append([t])
            size = bytes_
    return out


@torch.no_grad()
def broadcast_trainable(model: nn.Module, src: int = 0) -> None:
    """Every rank starts from rank ``src``'s trainable weights (a LoRA adapter's random A matrices included)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    for group in buckets([p.data for p in params], BUCKET_BYTES):
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.broadcast(flat, src=src)
        offset = 0
        for t in group:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


@dataclass
class NoGather:
    """The engine reads the trained tensors themselves: nothing to refresh after an update."""

    def refresh(self) -> float:
        return 0.0
