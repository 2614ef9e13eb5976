"""``checkpoint`` sync, the legacy mode: the trainer saves a Hugging Face checkpoint, the server reads it back.

The directory appears whole (written under a temporary name and renamed), so the server never reads half a save;
a damaged or incomplete file is refused by the server, which keeps its last version. Older sync checkpoints are
removed once the server has loaded the new one.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file
from torch import Tensor, nn

from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.sync.base import SyncReport
from tandemrl.sync.client import ServerClient
from tandemrl.sync.ranks import is_sharded


def full_state(model: nn.Module) -> dict[str, Tensor] | None:
    """Collective for an FSDP2-sharded model (every rank asks): its whole weights in rank 0's host memory; None for a
    plain model (``save_pretrained`` reads it directly)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_checkpoint(model: nn.Module, directory: Path, version: int) -> Path:
    """``directory/version-XXXXXXXX``: config + safetensors, as ``save_pretrained`` writes them."""
    weights = full_state(model)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"version-{version:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=directory))
    try:
        unwrap_causal_lm(model).save_pretrained(str(tmp), safe_serialization=True, state_dict=weights)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_checkpoint_tensors(path: str | Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint's ``*.safetensors`` files (a sharded save has several)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    tensors: dict[str, Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except Exception as exc:  # safetensors raises its own error types for a truncated or corrupt file
            raise ValueError(f"cannot read {file}: {exc}") from exc
    return tensors


class CheckpointSync:
    kind = "checkpoint"

    def __init__(self, client: ServerClient, directory: Path) -> None:
        self.client = client
        self.directory = Path(directory)

    def push(self, model: nn.Module, version: int) -> SyncReport:
        started = time.perf_counter()
        path = save_checkpoint(model, self.directory, version)
        self.client.post("/v1/weights/checkpoint", {"path": str(path.resolve()), "version": version})
        for old in self.directory.glob("version-*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        nbytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        return SyncReport(self.kind, version, time.perf_counter() - started, nbytes)

    def take_part(self, model: nn.Module) -> None:
        """Another rank of a torchrun job: gather the shards with rank 0 (a replicated model: nothing)."""
        full_state(model)

    def close(self) -> None:
        self.client.close()
