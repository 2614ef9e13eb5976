"""The rank's place in the job, read from torchrun's environment, and the process group's lifetime."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from tandemrl.config import DistributedConfig

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return all(name in env for name in _TORCHRUN_VARS)


def read_rank_env(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's variables; a clear error when one is missing or malformed."""
    env = os.environ if environ is None else environ
    values = []
    for name in _TORCHRUN_VARS:
        raw = env.get(name)
        if raw is None or not raw.strip().lstrip("-").isdigit():
            raise ValueError(f"environment variable {name}={raw!r}: expected an integer set by torchrun")
        values.append(int(raw))
    rank, world, local = values
    if not 0 <= rank < world or local < 0:
        raise ValueError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}: need 0 <= RANK < WORLD_SIZE")
    return rank, world, local


def rank_device(model_device: str, local_rank: int) -> torch.device:
    """One GPU per local rank (cuda:LOCAL_RANK); the CPU when asked or when there is no GPU."""
    if model_device == "cpu" or (model_device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if model_device not in ("auto", "cuda"):
        raise ValueError(f"model.device = {model_device!r}: under torchrun use 'auto', 'cuda' or 'cpu' "
                         "(each rank takes cuda:LOCAL_RANK)")
    if local_rank >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} GPU(s): "
                         "--nproc-per-node must not exceed the GPUs per node")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_process_group(cfg: DistributedConfig, model_device: str) -> RankInfo:
    """Join torchrun's rendezvous (env://): nccl on CUDA, gloo on the CPU unless distributed.backend says."""
    import torch.distributed as dist

    rank, world, local = read_rank_env()
    device = rank_device(model_device, local)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("distributed.backend = 'nccl' needs CUDA devices; use 'gloo' (or 'auto') on the CPU")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=cfg.timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return RankInfo(rank=rank, world_size=world, local_rank=local, device=device)


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
