"""Pick the WeightSync named by `sync.kind`."""

from __future__ import annotations

from pathlib import Path

from tandemrl.config import Config
from tandemrl.sync.base import InProcessSync, WeightSync


def make_weight_sync(cfg: Config, out_dir: Path, rank: int | None = None) -> WeightSync:
    """``rank``: this process's rank in a torchrun job (rank 0 pushes, the others take part: sync/ranks.py)."""
    if cfg.sync.kind == "inprocess":
        return InProcessSync()
    sync = _server_sync(cfg, out_dir)
    if rank is None:
        return sync
    from tandemrl.sync.ranks import RankSync

    return RankSync(sync, rank)  # type: ignore[arg-type]  # ipc, which cannot take part, is refused under torchrun


def _server_sync(cfg: Config, out_dir: Path) -> WeightSync:
    kind = cfg.sync.kind
    from tandemrl.sync.client import ServerClient

    client = ServerClient(cfg.rollout.server_url or "", timeout_s=cfg.rollout.server_timeout_s)
    if kind == "checkpoint":
        from tandemrl.sync.checkpoint import CheckpointSync

        return CheckpointSync(client, Path(cfg.sync.dir) if cfg.sync.dir else out_dir / "sync")
    if kind == "lora":
        from tandemrl.sync.lora import LoraSync

        return LoraSync(client)
    if kind == "ipc":
        from tandemrl.sync.ipc import IpcSync

        return IpcSync(client)
    from tandemrl.sync.nccl import NcclSync

    return NcclSync(client, cfg.sync.nccl_init_method or "", cfg.sync.nccl_backend, cfg.rollout.server_timeout_s,
                    cfg.sync.nccl_bucket_mb)
