"""``ipc`` sync (one GPU, two processes): the server maps the trainer's parameter memory through CUDA IPC handles,
so the weights exist once in GPU memory and a push after the first is a version bump.

First push: the trainer sends a handle per parameter (torch.multiprocessing's reductions, pickled); the server
rebuilds them, checks names and shapes, and between two steps points its parameters at them and frees its own copy
(the engine drops its CUDA graphs, which captured the old addresses). From then on the trainer's optimizer writes
the served weights in place: the trainer must not step while the server samples for it (the synchronous loop with
``rollout.max_staleness = 0`` guarantees it), and each push tells the server a new version (its prefix cache is
dropped). The handles are pickles: the server accepts them only when started with ``sync.kind = "ipc"``, and
binds 127.0.0.1 by default.
"""

from __future__ import annotations

import base64
import pickle
import time

import torch
from torch import Tensor, nn
from torch.multiprocessing.reductions import reduce_tensor

from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.sync.base import SyncReport
from tandemrl.sync.client import ServerClient


def _parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n.replace(".base_layer.", "."), p) for n, p in unwrap_causal_lm(model).named_parameters()
            if "lora_" not in n]


def share_handles(model: nn.Module) -> str:
    """Base64 of the pickled (name, rebuild function, its arguments) of every CUDA parameter."""
    handles = []
    for name, param in _parameters(model):
        if not param.is_cuda:
            raise ValueError(f"sync.kind = 'ipc' needs the model on a CUDA device; {name} is on {param.device}")
        rebuild, args = reduce_tensor(param.detach())
        handles.append((name, rebuild, args))
    return base64.b64encode(pickle.dumps(handles)).decode()


def open_handles(blob: str) -> dict[str, Tensor]:
    """The server's view of the trainer's tensors (same memory)."""
    handles = pickle.loads(base64.b64decode(blob))  # noqa: S301 - only with sync.kind = "ipc" (module doc)
    return {name: rebuild(*args) for name, rebuild, args in handles}


def attach(model: nn.Module, shared: dict[str, Tensor]) -> None:
    """Point ``model``'s parameters at ``shared`` (names and shapes checked first); its own copies are freed."""
    params = dict(_parameters(model))
    missing = sorted(set(params) - set(shared))
    if missing:
        raise ValueError(f"ipc handles missing for {len(missing)} parameters, e.g. {missing[:3]}")
    for name, tensor in shared.items():
        if name not in params:
            raise ValueError(f"ipc handle for {name!r}, which the served model does not have")
        if tensor.shape != params[name].shape or tensor.dtype != params[name].dtype:
            raise ValueError(f"{name}: shared {tuple(tensor.shape)} {tensor.dtype}, served "
                             f"{tuple(params[name].shape)} {params[name].dtype}")
    for name, param in params.items():
        param.data = shared[name]
    torch.cuda.empty_cache()


class IpcSync:
    kind = "ipc"

    def __init__(self, client: ServerClient) -> None:
        self.client = client
        self._attached = False

    def push(self, model: nn.Module, version: int) -> SyncReport:
        started = time.perf_counter()
        body: dict = {"version": version}
        if not self._attached:
            body["handles"] = share_handles(model)
        if any(p.is_cuda for p in model.parameters()):
            torch.cuda.synchronize()  # the optimizer's writes are done before the server reads
        self.client.post("/v1/weights/ipc", body)
        self._attached = True
        return SyncReport(self.kind, version, time.perf_counter() - started)

    def close(self) -> None:
        self.client.close()
