"""Checkpoints of a torchrun job: model and optimizer through torch.distributed.checkpoint (DCP, every rank writes
its shards, replicated tensors once; a load re-shards, so a run resumes with another number of processes or the
other distributed.strategy; frozen weights — LoRA's base — are left out, they come from the model), plus — from rank 0 — the full
weights in Hugging Face layout (from the engine replica: `tandemrl eval RUN_DIR` and `from_pretrained` read them),
tokenizer, scheduler, trainer state and one RNG file per rank.

Here in train/, beside the single-process checkpoint.py whose format it extends (train imports distributed, never
the reverse). The folder is published exactly as single-process checkpoints are: everything lands
in a staging folder, rank 0 writes COMPLETE, renames it to step-N and replaces `latest` only after every rank's
part is on disk — a rank dying at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tandemrl.distributed.parallel import Distributed
from tandemrl.train import atomic_dir
from tandemrl.train.checkpoint import (
    META_KEY, SCHEDULER, TRAINER_STATE, _cleanup, _encode_trainer_state, _meta, _reason, _write_complete,
    _write_latest, checkpoint_info, checkpoint_problem, step_dir_name,
)
from tandemrl.train.rng import capture_rng_state, restore_rng_state
from tandemrl.train.weights_io import CheckpointError, read_json

DCP_DIR = "dcp"
DCP_FORMAT = "fsdp-dcp"


def trained_only(strict: bool = True) -> Any:
    """DCP state-dict options: the trained weights and their optimizer state (LoRA: the adapter, not the base).
    Loading passes ``strict=False``: the frozen weights are absent on purpose (dcp.load already fails on a trained
    weight the checkpoint lacks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def rng_file(rank: int) -> str:
    return f"rng-rank{rank:05d}.pt"


def save_distributed(root: Path, step: int, *, parallel: Distributed, model: nn.Module, replica: nn.Module,
                     tokenizer: Any, optimizer: torch.optim.Optimizer, scheduler: Any, trainer_state: dict,
                     keep_last: int) -> Path:
    """Collective: every rank calls it with the same step. Returns the published folder."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rng_state = capture_rng_state()
    meta = {**_meta(step, replica, optimizer, scheduler), "model_format": DCP_FORMAT,
            "world_size": parallel.world_size}
    state_text = _encode_trainer_state(trainer_state, meta)
    root, name = Path(root), step_dir_name(step)
    final = root / name
    staging = [atomic_dir.staging_path(root, name) if parallel.is_main else None]
    dist.broadcast_object_list(staging, src=0)  # one staging folder, named by rank 0's pid
    tmp = Path(staging[0])
    try:
        if parallel.is_main:
            root.mkdir(parents=True, exist_ok=True)
            atomic_dir.clear(tmp)
            tmp.mkdir()
        parallel.barrier()
        model_state, optim_state = get_state_dict(model, optimizer, options=trained_only())
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp / DCP_DIR)
        torch.save(rng_state, tmp / rng_file(parallel.rank))
        source, weights = _hf_source(model, replica)
        if parallel.is_main:
            _write_main_files(tmp, source, tokenizer, scheduler, state_text, weights)
        parallel.barrier()  # every rank's shards and RNG file are written
        if parallel.is_main:
            _publish(root, tmp, final, name, step, keep_last)
        parallel.barrier()
    except Exception as exc:
        if parallel.is_main:
            atomic_dir.clear(tmp)  # best effort; a leftover is swept by the next save
        raise CheckpointError(f"could not write checkpoint step {step} to {final}: {_reason(exc)}; "
                              "the previous checkpoint is intact") from exc
    return final


def _hf_source(model: nn.Module, replica: nn.Module) -> tuple[nn.Module, dict | None]:
    """Collective. What the Hugging Face files are written from: the engine's replica, or the trained model when the
    engine holds only a tensor-parallel shard (engine.tensor_parallel_size > 1); an FSDP2-sharded source (sharded
    and no replica: a server samples) with its whole weights gathered into rank 0's host memory (never onto a GPU)."""
    from tandemrl.models.tensor_parallel import is_shard
    from tandemrl.sync.checkpoint import full_state

    source = model if is_shard(replica) else replica
    return source, full_state(source)


def _write_main_files(tmp: Path, replica: nn.Module, tokenizer: Any, scheduler: Any, state_text: str,
                      weights: dict | None = None) -> None:
    replica.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(scheduler.state_dict(), tmp / SCHEDULER)
    (tmp / TRAINER_STATE).write_text(state_text, encoding="utf-8")


def _publish(root: Path, tmp: Path, final: Path, name: str, step: int, keep_last: int) -> None:
    atomic_dir.fsync_tree(tmp)
    _write_complete(tmp, step)
    aside = atomic_dir.move_aside(root, final)
    os.replace(tmp, final)
    atomic_dir.fsync_dir(root)
    _write_latest(root, name)
    atomic_dir.fsync_dir(root)
    _cleanup(root, step, keep_last, aside)


def load_distributed(path: Path, *, parallel: Distributed, model: nn.Module, optimizer: torch.optim.Optimizer,
                     scheduler: Any) -> dict:
    """Collective: loads a DCP checkpoint saved with any number of ranks into this job's shards; returns the
    trainer state. RNG states come back exactly when the rank existed in the saving job."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"cannot load checkpoint {path}: {problem}")
    require_distributed_format(path, distributed=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=trained_only())
    state = {"model": model_state, "optim": optim_state}
    try:
        dcp.load(state, checkpoint_id=path / DCP_DIR)
    except Exception as exc:
        raise CheckpointError(f"cannot load {path / DCP_DIR} into this model and optimizer: {exc}") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=trained_only(strict=False))
    scheduler.load_state_dict(torch.load(path / SCHEDULER, map_location="cpu", weights_only=True))
    rng = path / rng_file(parallel.rank)
    if rng.is_file():
        restore_rng_state(torch.load(rng, map_location="cpu", weights_only=True))
    trainer_state = read_json(path / TRAINER_STATE)
    trainer_state.pop(META_KEY, None)
    return trainer_state


def require_distributed_format(path: Path, distributed: bool) -> None:
    """A torchrun checkpoint resumes under torchrun (any process count, 1 included), a single-process one without."""
    saved_dcp = checkpoint_info(path).get("model_format") == DCP_FORMAT
    if saved_dcp and not distributed:
        raise CheckpointError(f"checkpoint {path} was saved by a torchrun job (FSDP shards through DCP): resume it "
                              "with `torchrun --nproc-per-node N -m tandemrl train --resume ...` (any N, 1 included)")
    if distributed and not saved_dcp:
        raise CheckpointError(f"checkpoint {path} was saved by a single-process run: resume it without torchrun, or "
                              "start the torchrun job from its weights (model.name_or_path = that folder)")
