"""The WeightSync protocol: how a trainer gets its new weights into the process that samples its rollouts.

``push(model, version)`` makes the rollout process compute with ``model``'s current weights under ``version``
and returns what it cost. Kinds (``sync.kind``): ``inprocess`` (the engine decodes with the trainer's own tensors:
nothing to do), ``checkpoint`` (save, the server reloads), ``lora`` (only the peft adapter's tensors travel),
``ipc`` (same GPU: the server maps the trainer's tensors through CUDA IPC handles, one copy in memory), ``nccl``
(another GPU: a torch.distributed broadcast). A push either completes or leaves the server on its last version.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from torch import nn

SYNC_KINDS = ("inprocess", "checkpoint", "lora", "ipc", "nccl")


@dataclasses.dataclass
class SyncReport:
    kind: str
    version: int
    seconds: float
    bytes: int = 0  # bytes that travelled (0 for shared memory)

    def metrics(self) -> dict[str, float]:
        return {"sync/seconds": self.seconds, "sync/mb": self.bytes / 2**20}


class WeightSync(Protocol):
    kind: str

    def push(self, model: nn.Module, version: int) -> SyncReport: ...

    def close(self) -> None: ...


class InProcessSync:
    """The default: the rollout engine reads the trainer's parameters in place, so there is nothing to push."""

    kind = "inprocess"

    def push(self, model: nn.Module, version: int) -> SyncReport:
        return SyncReport(self.kind, version, 0.0)

    def close(self) -> None:
        pass
