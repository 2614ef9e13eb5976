"""``nccl`` sync: the trainer (rank 0) broadcasts every parameter to the server (rank 1) over torch.distributed.

NCCL between two GPUs; gloo works the same way on CPU (the tests use it). The server receives into staging buffers
and copies them in between engine steps only once all arrived: a broadcast that breaks off leaves the served
weights whole (the staging costs one more copy of the weights while it lasts).

The order and shapes are those of the causal LM's ``named_parameters()`` (each tied tensor once), announced to
the server by name in the push request, so a mismatch is refused before any byte moves.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.sync.base import SyncReport
from tandemrl.sync.client import ServerClient

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16)}


def parameter_specs(model: nn.Module) -> list[dict]:
    """[{name, shape, dtype}] in broadcast order."""
    return [{"name": n, "shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
            for n, p in _parameters(model)]


def _parameters(model: nn.Module) -> list[tuple[str, Tensor]]:
    return [(n.replace(".base_layer.", "."), p) for n, p in unwrap_causal_lm(model).named_parameters()
            if "lora_" not in n]


def init_group(init_method: str, rank: int, backend: str, timeout_s: float) -> None:
    """Join the two-process group (trainer rank 0, server rank 1); blocks until both have joined."""
    if dist.is_initialized():
        return
    dist.init_process_group(backend, init_method=init_method, world_size=2, rank=rank,
                            timeout=datetime.timedelta(seconds=timeout_s))


def send_parameters(model: nn.Module) -> int:
    """Rank 0: broadcast every parameter; returns the bytes sent."""
    nbytes = 0
    with torch.no_grad():
        for _, param in _parameters(model):
            tensor = param.detach().contiguous()
            dist.broadcast(tensor, src=0)
            nbytes += tensor.numel() * tensor.element_size()
    return nbytes


def receive_parameters(specs: list[dict], device: torch.device) -> dict[str, Tensor]:
    """Rank 1: receive every announced tensor into fresh buffers (nothing is applied here)."""
    tensors = {}
    for spec in specs:
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {spec['name']!r}: dtype {spec['dtype']!r} is not one of {sorted(_DTYPES)}")
        buffer = torch.empty(spec["shape"], dtype=dtype, device=device)
        dist.broadcast(buffer, src=0)
        tensors[spec["name"]] = buffer
    return tensors


def check_same_parameters(ours: list[dict], theirs: list[dict]) -> None:
    """ValueError naming the first difference between the trainer's and the server's parameters."""
    for mine, served in zip(ours, theirs):
        if mine != served:
            raise ValueError(f"nccl sync: the trainer's parameter {mine} differs from the server's {served}; both "
                             "must load the same architecture (and dtype)")
    if len(ours) != len(theirs):
        raise ValueError(f"nccl sync: the trainer has {len(ours)} parameters, the server {len(theirs)}")


class NcclSync:
    """The trainer's side: first push joins the group (the server joins through POST /v1/weights/nccl/init)."""

    kind = "nccl"

    def __init__(self, client: ServerClient, init_method: str, backend: str = "nccl", timeout_s: float = 600) -> None:
        self.client = client
        self.init_method = init_method
        self.backend = backend
        self.timeout_s = timeout_s
        self._joined = False

    def push(self, model: nn.Module, version: int) -> SyncReport:
        started = time.perf_counter()
        if not self._joined:
            joined: list[dict] = []
            self._in_background(lambda: joined.append(self.client.post(
                "/v1/weights/nccl/init", {"init_method": self.init_method, "backend": self.backend})),
                lambda: init_group(self.init_method, 0, self.backend, self.timeout_s))
            check_same_parameters(parameter_specs(model), joined[0]["tensors"])
            self._joined = True
        sent: list[int] = []
        self._in_background(lambda: self.client.post(
            "/v1/weights/nccl/push", {"version": version, "tensors": parameter_specs(model)}),
            lambda: sent.append(send_parameters(model)))
        return SyncReport(self.kind, version, time.perf_counter() - started, sent[0])

    @staticmethod
    def _in_background(request: Callable[[], dict], work: Callable[[], None]) -> None:
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

    def close(self) -> None:
        self.client.close()
        if dist.is_initialized():
            dist.destroy_process_group()
