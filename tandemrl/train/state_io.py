"""The run directory: resolved config, checkpoints of the whole trainer state, the summary."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from tandemrl.config import Config, config_to_toml
from tandemrl.train.checkpoint import find_latest, load_checkpoint, save_checkpoint
from tandemrl.train.setup import Run, TrainerState


def check_out_dir(out_dir: Path, resume: bool) -> None:
    """Refuse to start a new run over one that has checkpoints; writes nothing (so a bad config, dataset or model
    that fails later in setup leaves no run directory behind)."""
    # only a complete checkpoint counts: a kill during the first save leaves just a .tmp-* folder
    if not resume and find_latest(out_dir / "checkpoints") is not None:
        raise FileExistsError(
            f"{out_dir} already holds a run with checkpoints; pass --resume to continue it or choose another --out"
        )


def write_run_config(out_dir: Path, cfg: Config) -> None:
    """Create the run directory and its config.toml: called once setup (data, model, task) has succeeded."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir / "config.toml", config_to_toml(cfg))


BEST = "best"  # checkpoints/best/: the best epoch evaluation's checkpoint (a checkpoint root of its own)


def save_run(run: Run, state: TrainerState, best: bool = False) -> Path:
    """The whole trainer state into checkpoints/ (or, ``best``, into checkpoints/best/, keeping one)."""
    state.data = run.train_prompts.state_dict()
    state.curriculum = run.curriculum.state_dict() if run.curriculum is not None else {}
    if run.engine_model is not None:  # torchrun: a collective save of the shards (tandemrl/distributed/checkpoint.py)
        from tandemrl.distributed.checkpoint import save_distributed

        root = run.out_dir / "checkpoints"
        return save_distributed(
            root / BEST if best else root, state.step, parallel=run.parallel, model=run.model,
            replica=run.engine_model, tokenizer=run.tokenizer, optimizer=run.optimizer, scheduler=run.scheduler,
            trainer_state=asdict(state), keep_last=1 if best else run.cfg.checkpoint.keep_last,
        )
    root = run.out_dir / "checkpoints"
    return save_checkpoint(
        root / BEST if best else root, state.step, model=run.model, tokenizer=run.tokenizer,
        optimizer=run.optimizer, scheduler=run.scheduler, trainer_state=asdict(state),
        keep_last=1 if best else run.cfg.checkpoint.keep_last,
    )


def restore_run(run: Run) -> TrainerState | None:
    """The state of the latest complete checkpoint, loaded into `run`; None if no save ever finished."""
    path = find_latest(run.out_dir / "checkpoints")
    if path is None:
        return None
    from tandemrl.distributed.checkpoint import load_distributed, require_distributed_format

    if run.engine_model is not None:
        raw = load_distributed(path, parallel=run.parallel, model=run.model, optimizer=run.optimizer,
                               scheduler=run.scheduler)
        run.engine_weights.refresh()  # the engine decodes the loaded weights
    else:
        require_distributed_format(path, distributed=False)
        raw = load_checkpoint(path, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
    state = TrainerState(**raw)
    run.train_prompts.load_state_dict(state.data)
    if run.curriculum is not None and state.curriculum:
        run.curriculum.load_state_dict(state.curriculum)
    return state


def write_summary(out_dir: Path, summary: dict) -> None:
    _write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
