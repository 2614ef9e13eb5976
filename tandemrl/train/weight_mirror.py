"""The rollout worker's own copy of the policy, and how the trainer's new weights reach it.

The trainer publishes after each update: its trainable tensors are copied into a staging copy on the worker's
device (the push; another GPU's copy travels over NVLink/PCIe here). The worker applies the staged weights between
two engine steps (its sequences continue under them), and the trainer never waits for the worker to finish a batch:
only a publish that meets an apply waits for it (one device-local copy).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import torch
from torch import nn


class WeightMirror:
    """``target``: the worker's model, a copy of ``source`` (the trainer's) taken at ``version``."""

    def __init__(self, source: nn.Module, target: nn.Module, version: int) -> None:
        self.target = target
        target_params = dict(target.named_parameters())
        # frozen tensors (a LoRA base model) never change: only the trainable ones travel
        names = [name for name, p in source.named_parameters() if p.requires_grad]
        missing = [name for name in names if name not in target_params]
        if missing:
            raise ValueError(f"the rollout copy lacks {len(missing)} trained tensors, e.g. {missing[0]}")
        sources = dict(source.named_parameters())
        self._pairs = [(sources[n], target_params[n]) for n in names]
        self._staging = [torch.empty_like(dst) for _, dst in self._pairs]
        # the push's own stream on the worker's device: its copies then wait for none of the engine steps the worker
        # has queued there (on the device's default stream), only for the trainer's update
        staging_device = self._staging[0].device if self._staging else torch.device("cpu")
        self._push_stream = torch.cuda.Stream(staging_device) if staging_device.type == "cuda" else None
        self._side_streams: dict[torch.device, torch.cuda.Stream] = {}  # the trainer's devices' copy streams
        self._lock = threading.Lock()
        self._staged: int | None = None
        self.applied = version
        self.pause_s = 0.0  # how long the last apply held the worker (its copy of the staged weights)
        self.bytes = sum(t.numel() * t.element_size() for t in self._staging)

    @classmethod
    def copy_of(cls, model: nn.Module, device: torch.device, version: int) -> WeightMirror:
        """A frozen copy of ``model`` on ``device`` (the worker's) and its mirror."""
        with torch.no_grad():
            target = copy.deepcopy(model).to(device)
        target.eval().requires_grad_(False)
        return cls(model, target, version)

    def publish(self, version: int) -> float:
        """Trainer thread: stage the source's current weights as ``version``; the seconds it took."""
        started = time.perf_counter()
        with self._lock, torch.no_grad():
            if self._push_stream is None:
                for (src, _), stage in zip(self._pairs, self._staging):
                    stage.copy_(src.detach())
            else:
                self._push_on_stream(self._push_stream)
            self._staged = version
        return time.perf_counter() - started

    def _push_on_stream(self, stream: torch.cuda.Stream) -> None:
        """The copies, after the trainer's update, and back once they are done. On the staging device they run on
        ``stream``. A copy from another GPU runs on a side stream of the source's device: issued on that device's
        default (legacy) stream, a peer copy also waited for the worker device's default stream, where its engine
        steps are queued (measured on 2 x H100: a push waited 2 s for a 2 s queue)."""
        with contextlib.ExitStack() as streams:
            streams.enter_context(torch.cuda.stream(stream))
            for device in {src.device for src, _ in self._pairs if src.device.type == "cuda"}:
                trainer_stream = torch.cuda.current_stream(device)
                side = stream if device == stream.device else self._side_stream(device)
                side.wait_stream(trainer_stream)  # after the update
                streams.enter_context(torch.cuda.stream(side))
            for (src, _), stage in zip(self._pairs, self._staging):
                stage.copy_(src.detach(), non_blocking=True)
        stream.synchronize()

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._side_streams:
            self._side_streams[device] = torch.cuda.Stream(device)
        return self._side_streams[device]

    def apply(self) -> int:
        """Worker thread, between two engine steps: take the staged weights if newer; the version it now holds."""
        with self._lock, torch.no_grad():
            if self._staged is not None and self._staged > self.applied:
                started = time.perf_counter()
                for (_, dst), stage in zip(self._pairs, self._staging):
                    dst.copy_(stage)
                _synchronize(self._staging)
                self.applied = self._staged
                self.pause_s = time.perf_counter() - started
            return self.applied


def _synchronize(tensors: list[torch.Tensor]) -> None:
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for device in devices:
        torch.cuda.synchronize(device)
