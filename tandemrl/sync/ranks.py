"""A torchrun job's push to a separate server (rollout.backend = "server"): rank 0 pushes; every other rank takes part
in what the push gathers (an FSDP2-sharded model's full tensors, in the push's order) and sends nothing. All ranks
then receive rank 0's report, so none asks the server for rollouts before it serves the new version."""

from __future__ import annotations

from typing import Protocol

import torch.distributed as dist
from torch import nn

from tandemrl.sync.base import SyncReport


class SharedPush(Protocol):
    """A WeightSync that a torchrun job's other ranks can take part in."""

    kind: str

    def push(self, model: nn.Module, version: int) -> SyncReport: ...

    def take_part(self, model: nn.Module) -> None: ...

    def close(self) -> None: ...


class RankSync:
    """This rank's side of ``sync``'s push: rank 0 pushes, the others ``take_part``; every rank returns rank 0's
    report once the server holds the weights (the broadcast is the wait)."""

    def __init__(self, sync: SharedPush, rank: int) -> None:
        self.sync, self.rank, self.kind = sync, rank, sync.kind

    def push(self, model: nn.Module, version: int) -> SyncReport:
        if self.rank == 0:
            report = self.sync.push(model, version)
        else:
            self.sync.take_part(model)
        reports = [report if self.rank == 0 else None]
        dist.broadcast_object_list(reports, src=0)
        return reports[0]

    def close(self) -> None:
        self.sync.close()


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter is an FSDP2 shard (a DTensor): then a push gathers, and every rank must ask."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())
