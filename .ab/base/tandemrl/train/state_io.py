"""The run directory: resolved config, checkpoints of the whole trainer state, the summary."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from tandemrl.config import Config, config_to_toml
from tandemrl.train.checkpoint import find_latest, load_checkpoint, save_checkpoint
from tandemrl.train.setup import Run, TrainerState


def prepare_out_dir(out_dir: Path, cfg: Config, resume: bool) -> None:
    if not resume and (out_dir / "checkpoints").exists() and any((out_dir / "checkpoints").iterdir()):
        raise FileExistsError(
            f"{out_dir} already holds a run with checkpoints; pass --resume to continue it or choose another --out"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir / "config.toml", config_to_toml(cfg))


def save_run(run: Run, state: TrainerState) -> Path:
    state.data = run.train_prompts.state_dict()
    return save_checkpoint(
        run.out_dir / "checkpoints", state.step, model=run.model, tokenizer=run.tokenizer,
        optimizer=run.optimizer, scheduler=run.scheduler, trainer_state=asdict(state),
        keep_last=run.cfg.checkpoint.keep_last,
    )


def restore_run(run: Run) -> TrainerState:
    path = find_latest(run.out_dir / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {run.out_dir / 'checkpoints'}")
    raw = load_checkpoint(path, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
    state = TrainerState(**raw)
    run.train_prompts.load_state_dict(state.data)
    return state


def write_summary(out_dir: Path, summary: dict) -> None:
    _write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
