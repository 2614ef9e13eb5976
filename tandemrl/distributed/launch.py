"""Entering and leaving a torchrun job, and the checks its layout needs before any work starts."""

from __future__ import annotations

import contextlib
from typing import Iterator

from tandemrl.config import Config
from tandemrl.distributed.env import RankInfo, destroy_process_group, init_process_group, launched_by_torchrun
from tandemrl.distributed.heartbeat import Heartbeat, torchrun_store
from tandemrl.distributed.parallel import Distributed, Parallel, SingleProcess


@contextlib.contextmanager
def process_group(cfg: Config) -> Iterator[RankInfo | None]:
    """Under torchrun: this rank's place in the joined process group (left on exit); a plain run: None."""
    if not launched_by_torchrun():
        yield None
        return
    check_layout(cfg, _world_size_from_env())
    info = init_process_group(cfg.distributed, cfg.model.device)
    heartbeat = start_heartbeat(cfg, info)
    try:
        yield info
        Distributed(info).barrier()  # no rank closes its connections while another still uses them
        if heartbeat is not None:
            heartbeat.stop()  # after the barrier: every rank is done, none may be taken for dead
    finally:  # after an error: no barrier (it would wait for ranks that are gone), just leave
        destroy_process_group()


def start_heartbeat(cfg: Config, info: RankInfo) -> Heartbeat | None:
    """The watchdog that ends the job when a rank stops beating (none when the job has one rank or no store)."""
    store = torchrun_store(cfg.distributed.heartbeat_timeout_s) if info.world_size > 1 else None
    if store is None:
        return None
    return Heartbeat(store, info.rank, info.world_size, cfg.distributed.heartbeat_timeout_s).start()


def make_parallel(info: RankInfo | None, tensor_parallel_size: int = 1) -> Parallel:
    return SingleProcess() if info is None else Distributed(info, tensor_parallel_size)


def check_layout(cfg: Config, world_size: int) -> None:
    """Each engine samples whole prompt groups; each rank trains on as many samples and takes the same number of
    optimizer steps."""
    prompts, tp = cfg.rollout.prompts_per_step, cfg.engine.tensor_parallel_size
    if world_size % tp:
        raise ValueError(f"engine.tensor_parallel_size = {tp} must divide the {world_size} processes (each group of "
                         f"{tp} consecutive ranks runs one engine)")
    engines = world_size // tp
    if prompts % engines:
        who = "processes" if tp == 1 else "engines (processes / engine.tensor_parallel_size)"
        raise ValueError(f"rollout.prompts_per_step = {prompts} must be a multiple of the {engines} {who} (each "
                         "samples whole groups of its share of the prompts)")
    engine_samples = prompts // engines * cfg.rollout.group_size
    if engine_samples % tp:
        raise ValueError(f"engine.tensor_parallel_size = {tp} must divide each engine's {engine_samples} samples "
                         "(rollout.prompts_per_step / engines * rollout.group_size): its ranks train on equal shares")
    local_samples = engine_samples // tp
    if local_samples % cfg.train.mini_batches:
        raise ValueError(f"train.mini_batches = {cfg.train.mini_batches} must divide each rank's "
                         f"{local_samples} samples (rollout.prompts_per_step / processes * rollout.group_size)")
    if cfg.model.lora.enabled and tp > 1:
        raise ValueError(f"engine.tensor_parallel_size = {tp} does not take model.lora.enabled: the engine's shards "
                         "are cut from a plain model (LoRA models are small enough for a whole engine per rank)")
    if cfg.model.lora.enabled and cfg.distributed.strategy == "shard":
        raise ValueError("distributed.strategy = 'shard' does not take model.lora.enabled: LoRA replicates (each "
                         "rank holds the base and the adapter); use 'auto' or 'replicate'")
    check_rollout_backend(cfg, tp)


def check_rollout_backend(cfg: Config, tp: int) -> None:
    """Each rank samples with its own engine, or sends its share of the prompts to one `tandemrl serve` process."""
    backend = cfg.rollout.backend
    if backend not in ("engine", "server"):
        raise ValueError(f"rollout.backend = {backend!r} is not supported under torchrun yet: use 'engine' (each "
                         "rank runs its own engine) or 'server' (the ranks share a `tandemrl serve` process)")
    if backend != "server":
        return
    if tp > 1:
        raise ValueError(f"engine.tensor_parallel_size = {tp} splits the trainer's own engine; with rollout.backend "
                         "= 'server' the server samples (set its engine.tensor_parallel_size in the server's config)")
    if cfg.sync.kind == "ipc":
        raise ValueError("sync.kind = 'ipc' is not supported under torchrun: the server maps one process's GPU "
                         "memory, while a torchrun job's weights are spread over its ranks' GPUs (and sharded); use "
                         "sync.kind = 'nccl'")


def _world_size_from_env() -> int:
    from tandemrl.distributed.env import read_rank_env

    return read_rank_env()[1]
