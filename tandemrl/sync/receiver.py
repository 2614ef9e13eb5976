"""The server's side of every weight push: a complete set of named tensors is checked against the served model,
then copied into its parameters in place between two engine steps; anything less is refused and the server keeps
serving the last complete version.

Tensors are matched by name, with the names each kind uses:
- ``full``: the causal LM's own state-dict names (``model.layers.0...``, what ``save_pretrained`` writes); every
  parameter must come (a tied ``lm_head.weight`` may be left out);
- ``adapter``: the peft model's names of its LoRA tensors (``...lora_A.default.weight``); every one must come.
In-place copies keep every tensor the engine holds (and its CUDA graphs) valid; the prefix cache is invalidated.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Literal, Protocol

import torch
from torch import Tensor, nn

from tandemrl.models.lora import unwrap_causal_lm

Scope = Literal["full", "adapter"]


class VersionedEngine(Protocol):
    def set_policy_version(self, version: int) -> None:
        """The weights changed in place: name their version, drop the prefix cache (engine/engine.py)."""
        ...


class ServingLoop(Protocol):
    """What a receiver needs of the server's engine loop (serve/engine_loop.py's EngineLoop): the served policy
    version, its engine's prefix cache and work run between two steps. A protocol, not an import: the server
    imports this module."""

    policy_version: int

    @property
    def engine(self) -> VersionedEngine: ...

    def between_steps(self, fn: Callable[[], Any]) -> Future: ...


class WeightPushError(ValueError):
    """A push that cannot be applied; the message says what was wrong and which version is still served."""


@dataclasses.dataclass
class PushRecord:
    kind: str
    version: int
    ok: bool
    seconds: float
    bytes: int = 0
    error: str | None = None


def target_tensors(model: nn.Module, scope: Scope) -> tuple[dict[str, Tensor], set[str]]:
    """The served model's tensors a push of ``scope`` may write, by the names the sender uses, and the names it
    must cover (each parameter once: a tied ``lm_head.weight`` is the embedding's alias)."""
    if scope == "adapter":
        named = {n: p for n, p in model.named_parameters() if "lora_" in n}
        if not named:
            raise WeightPushError("this server's model has no LoRA adapter: start it with model.lora.enabled = true "
                                  "and the trainer's rank/alpha/target_modules")
        return named, set(named)
    causal = unwrap_causal_lm(model)

    def clean(name: str) -> str:  # peft injects LoRA layers in place: their base weights are ...base_layer.weight
        return name.replace(".base_layer.", ".")

    every = {clean(n): t for n, t in causal.state_dict(keep_vars=True).items() if "lora_" not in n}
    required = {clean(n) for n, _ in causal.named_parameters() if "lora_" not in n}
    return every, required


class WeightReceiver:
    """Applies pushes to ``model`` through ``loop`` (between engine steps); keeps the history the routes report."""

    def __init__(self, model: nn.Module, loop: ServingLoop, kind: str) -> None:
        self.model = model
        self.loop = loop
        self.kind = kind
        self.pushes = 0
        self.failures = 0
        self.last_push: PushRecord | None = None
        self._lock = threading.Lock()  # one push at a time

    def status(self) -> dict:
        return {"policy_version": self.loop.policy_version, "sync_kind": self.kind, "pushes": self.pushes,
                "failures": self.failures,
                "last_push": dataclasses.asdict(self.last_push) if self.last_push else None}

    def apply(self, kind: str, version: int, load: Callable[[], dict[str, Tensor]], scope: Scope) -> PushRecord:
        """``load`` produces the pushed tensors (read a file, parse a body, receive a broadcast); if it or the
        checks fail, nothing is applied."""
        def push() -> int:
            tensors = load()
            targets, required = target_tensors(self.model, scope)
            _check_complete(tensors, targets, required)
            self.loop.between_steps(lambda: self._copy(tensors, targets, version)).result()
            return sum(t.numel() * t.element_size() for t in tensors.values())

        return self._recorded(kind, version, push)

    def set_version(self, kind: str, version: int, change: Callable[[], None] | None = None) -> PushRecord:
        """A push whose tensors are already in place (shared memory): run ``change`` between steps, bump the
        version, drop the prefix cache."""
        def bump() -> None:
            if change is not None:
                change()
            self.loop.engine.set_policy_version(version)
            self.loop.policy_version = version

        return self._recorded(kind, version, lambda: self.loop.between_steps(bump).result() or 0)

    def _recorded(self, kind: str, version: int, push: Callable[[], int]) -> PushRecord:
        """Run ``push`` (returns the bytes it moved) under the lock and record it; a failure is a WeightPushError
        that says which version is still served."""
        started = time.perf_counter()
        with self._lock:
            try:
                nbytes = push()
            except Exception as exc:  # noqa: BLE001 - reported to the pusher, the server keeps serving
                self.failures += 1
                message = (f"weight push ({kind}, version {version}) not applied: {exc}; still serving policy "
                           f"version {self.loop.policy_version}")
                self.last_push = PushRecord(kind, version, False, time.perf_counter() - started, error=message)
                raise WeightPushError(message) from exc
            self.pushes += 1
            self.last_push = PushRecord(kind, version, True, time.perf_counter() - started, nbytes)
            return self.last_push

    def _copy(self, tensors: dict[str, Tensor], targets: dict[str, Tensor], version: int) -> None:
        with torch.no_grad():
            for name, tensor in tensors.items():
                targets[name].copy_(tensor, non_blocking=True)
        if any(t.is_cuda for t in targets.values()):
            torch.cuda.synchronize()
        self.loop.engine.set_policy_version(version)  # later tokens record it; no cached prefix survives
        self.loop.policy_version = version


def _check_complete(tensors: dict[str, Tensor], targets: dict[str, Tensor], required: set[str]) -> None:
    unknown = sorted(set(tensors) - set(targets))
    if unknown:
        raise WeightPushError(f"{len(unknown)} tensors are not in the served model, e.g. {unknown[:3]}")
    missing = sorted(required - set(tensors))
    if missing:
        raise WeightPushError(f"incomplete push: {len(missing)} of {len(required)} tensors missing, e.g. "
                              f"{missing[:3]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(targets[name].shape):
            raise WeightPushError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the served model's "
                                  f"{tuple(targets[name].shape)}")
        if not torch.isfinite(tensor).all():
            raise WeightPushError(f"tensor {name!r} has NaN or inf values")
