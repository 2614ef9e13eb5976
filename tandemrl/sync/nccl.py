"""``nccl`` sync: the trainer broadcasts its weights to the server over a two-process group of its own (trainer
rank 0, server rank 1), bucket by bucket.

NCCL between two GPUs; gloo works the same way on CPU (the tests use it). The group is built from a TCP store at
``sync.nccl_init_method``, outside torch.distributed's default group: a trainer under torchrun keeps its own.

The sender copies the parameters' bytes, in order, into one buffer of ``sync.nccl_bucket_mb`` and broadcasts it
each time it is full (sync/buckets.py): beyond its weights it holds one bucket, and for an FSDP2-sharded model the
one parameter being gathered (every rank gathers it; only rank 0 sends). The server receives the buckets straight
into one staging buffer and copies them into its parameters between engine steps only once all arrived: a broadcast
that breaks off leaves the served weights whole (the staging costs the server one more copy while it lasts).

The order and shapes are those of the causal LM's ``named_parameters()`` (each tied tensor once), announced to the
server by name in the push request with the bucket size, so a mismatch is refused before any byte moves.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from typing import Any, Callable
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.sync.base import SyncReport
from tandemrl.sync.buckets import filled_buckets, layout, received_tensors
from tandemrl.sync.client import ServerClient
from tandemrl.sync.ranks import is_sharded

DEFAULT_BUCKET_MB = 256


def parameter_specs(model: nn.Module) -> list[dict]:
    """[{name, shape, dtype}] in broadcast order (a sharded parameter's full shape)."""
    return [{"name": n, "shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
            for n, p in named_weights(model)]


def named_weights(model: nn.Module) -> list[tuple[str, Tensor]]:
    """The pushed tensors, by the names the server matches (LoRA's base weights under their plain names)."""
    return [(n.replace(".base_layer.", "."), p) for n, p in unwrap_causal_lm(model).named_parameters()
            if "lora_" not in n]


def full_weight(param: Tensor) -> Tensor:
    """The whole tensor: an FSDP2 shard (DTensor) is all-gathered (every rank of the trainer's group must ask)."""
    from torch.distributed.tensor import DTensor

    return param.full_tensor() if isinstance(param, DTensor) else param


@dataclasses.dataclass
class SyncGroup:
    """The trainer and the server, a two-process group outside the default one."""

    backend: Any  # a c10d ProcessGroupNCCL / ProcessGroupGloo
    store: dist.TCPStore  # kept alive as long as the group

    def broadcast(self, tensor: Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.backend.broadcast([tensor], options).wait()

    def close(self) -> None:
        abort = getattr(self.backend, "abort", None)  # NCCL: free the communicator now (gloo has nothing to free)
        if abort is not None:
            abort()


def open_group(init_method: str, rank: int, backend: str, timeout_s: float) -> SyncGroup:
    """Join the two-process group (trainer rank 0 hosts the store); blocks until both have joined."""
    address = urlparse(init_method)
    if address.scheme != "tcp" or not address.hostname or not address.port:
        raise ValueError(f"sync.nccl_init_method = {init_method!r}: expected 'tcp://HOST:PORT'")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(address.hostname, address.port, 2, rank == 0, timeout=timeout, wait_for_workers=True)
    if backend == "gloo":
        return SyncGroup(dist.ProcessGroupGloo(store, rank, 2, timeout), store)
    if backend != "nccl":
        raise ValueError(f"sync.nccl_backend = {backend!r}: expected 'nccl' or 'gloo'")
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    options.group_name = "tandemrl_weight_sync"  # what NCCL's watchdog names in its messages
    return SyncGroup(dist.ProcessGroupNCCL(store, rank, 2, options), store)


def send_parameters(model: nn.Module, group: SyncGroup | None, bucket_bytes: int) -> int:
    """Broadcast every parameter bucket by bucket (``group`` None: a sharded trainer's other ranks, which only
    take part in the gathers); returns the bytes sent."""
    weights = named_weights(model)
    segments, total = layout(parameter_specs(model))
    device = weights[0][1].device if weights else torch.device("cpu")
    with torch.no_grad():
        for bucket in filled_buckets(segments, total, lambda i: full_weight(weights[i][1]), bucket_bytes, device):
            if group is not None:
                group.broadcast(bucket)
    return total if group is not None else 0


def receive_parameters(group: SyncGroup, specs: list[dict], bucket_bytes: int,
                       device: torch.device) -> dict[str, Tensor]:
    """Rank 1: receive every bucket into one staging buffer; the tensors are views of it (nothing is applied)."""
    segments, total = layout(specs)
    staging = torch.empty(total, dtype=torch.uint8, device=device)
    for start in range(0, total, bucket_bytes):
        group.broadcast(staging[start:start + bucket_bytes])
    return received_tensors(segments, staging)


def check_same_parameters(ours: list[dict], theirs: list[dict]) -> None:
    """ValueError naming the first difference between the trainer's and the server's parameters."""
    for mine, served in zip(ours, theirs):
        if mine != served:
            raise ValueError(f"nccl sync: the trainer's parameter {mine} differs from the server's {served}; both "
                             "must load the same architecture (and dtype)")
    if len(ours) != len(theirs):
        raise ValueError(f"nccl sync: the trainer has {len(ours)} parameters, the server {len(theirs)}")


class NcclSync:
    """The trainer's side: the first push joins the group (the server joins through POST /v1/weights/nccl/init)."""

    kind = "nccl"

    def __init__(self, client: ServerClient, init_method: str, backend: str = "nccl", timeout_s: float = 600,
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        self.client = client
        self.init_method = init_method
        self.backend = backend
        self.timeout_s = timeout_s
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.group: SyncGroup | None = None

    def push(self, model: nn.Module, version: int) -> SyncReport:
        started = time.perf_counter()
        try:
            if self.group is None:
                self.group = self._join(model)
            sent: list[int] = []
            body = {"version": version, "tensors": parameter_specs(model), "bucket_bytes": self.bucket_bytes}
            group = self.group
            self._in_background(lambda: self.client.post("/v1/weights/nccl/push", body),
                                lambda: sent.append(send_parameters(model, group, self.bucket_bytes)))
        except BaseException:
            self.close_group()  # the server drops its side of a broken push: the next push joins anew
            raise
        return SyncReport(self.kind, version, time.perf_counter() - started, sent[0])

    def take_part(self, model: nn.Module) -> None:
        """Another rank of a torchrun job: gather the shards with rank 0, in its order (a replicated model: nothing)."""
        if is_sharded(model):
            send_parameters(model, None, self.bucket_bytes)

    def _join(self, model: nn.Module) -> SyncGroup:
        answers: list[dict] = []
        groups: list[SyncGroup] = []
        body = {"init_method": self.init_method, "backend": self.backend, "timeout_s": self.timeout_s}
        self._in_background(lambda: answers.append(self.client.post("/v1/weights/nccl/init", body)),
                            lambda: groups.append(open_group(self.init_method, 0, self.backend, self.timeout_s)))
        try:
            check_same_parameters(parameter_specs(model), answers[0]["tensors"])
        except ValueError:
            groups[0].close()
            raise
        return groups[0]

    @staticmethod
    def _in_background(request: Callable[[], Any], work: Callable[[], None]) -> None:
        """Send ``request`` (it returns when the server is done) while this thread does ``work``; either's error
        is raised here."""
        errors: list[BaseException] = []

        def call() -> None:
            try:
                request()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                errors.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        work()
        thread.join()
        if errors:
            raise errors[0]

    def close_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def close(self) -> None:
        self.client.close()
        self.close_group()
