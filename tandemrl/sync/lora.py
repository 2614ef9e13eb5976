"""``lora`` sync: only the peft adapter's tensors travel (safetensors bytes in one HTTP body); the server, started
with the same LoRA settings, copies them into its adapter between two engine steps (requests keep running)."""

from __future__ import annotations

import time

from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from torch import Tensor, nn

from tandemrl.sync.base import SyncReport
from tandemrl.sync.client import ServerClient


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The LoRA tensors of a peft model, by the names the server's identical peft model has."""
    tensors = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    if not tensors:
        raise ValueError("sync.kind = 'lora' needs a LoRA model (model.lora.enabled = true)")
    return tensors


def encode_adapter(model: nn.Module) -> bytes:
    return save_bytes({n: t.contiguous().cpu() for n, t in adapter_tensors(model).items()})


def decode_adapter(payload: bytes) -> dict[str, Tensor]:
    if not payload:
        raise ValueError("the body is empty: expected the adapter's tensors in safetensors format")
    try:
        return load_bytes(payload)
    except Exception as exc:  # safetensors' own error types for a truncated or corrupt payload
        raise ValueError(f"the body is not a complete safetensors payload ({len(payload)} bytes): {exc}") from exc


class LoraSync:
    kind = "lora"

    def __init__(self, client: ServerClient) -> None:
        self.client = client

    def push(self, model: nn.Module, version: int) -> SyncReport:
        started = time.perf_counter()
        payload = encode_adapter(model)
        self.client.post("/v1/weights/lora", content=payload, params={"version": version})
        return SyncReport(self.kind, version, time.perf_counter() - started, len(payload))

    def take_part(self, model: nn.Module) -> None:
        """Another rank of a torchrun job: nothing (LoRA replicates: rank 0 holds the whole adapter)."""

    def close(self) -> None:
        self.client.close()
