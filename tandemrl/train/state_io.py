"""The run directory: resolved config, checkpoints of the whole trainer state, the summary."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import asdict, fields
from pathlib import Path

from tandemrl.config import Config, config_to_toml
from tandemrl.train.checkpoint import CheckpointError, find_latest, load_checkpoint, save_checkpoint
from tandemrl.train.evaluate import EvalResult
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
    if run.engine_model is not None:  # torchrun: a collective save of the shards (distributed_checkpoint.py)
        from tandemrl.train.distributed_checkpoint import save_distributed

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


class ResumeRefused(ValueError):
    """--resume with a config the checkpoint does not fit; raised before anything in the run directory changes."""


def restore_run(run: Run) -> TrainerState | None:
    """The state of the latest complete checkpoint, loaded into `run`; None if no save ever finished. A checkpoint
    that does not fit the config raises ResumeRefused, naming the keys that differ from the run's config.toml."""
    path = find_latest(run.out_dir / "checkpoints")
    if path is None:
        return None
    try:
        return _restore(run, path)
    except (ValueError, CheckpointError) as exc:
        changed = changed_keys(run.out_dir / "config.toml", run.cfg)
        differs = f"; keys that differ from {run.out_dir / 'config.toml'}: {changed}" if changed else ""
        raise ResumeRefused(f"cannot resume {run.out_dir} from {path.name}: {exc}{differs}; nothing was changed "
                            "(resume without the --set/--config that changed them)") from exc


def _restore(run: Run, path: Path) -> TrainerState:
    from tandemrl.train.distributed_checkpoint import load_distributed, require_distributed_format

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


def changed_keys(saved: Path, cfg: Config, show: int = 5) -> str:
    """'data.task ('synthetic:add' -> 'synthetic:copy'), ...': where `cfg` differs from the config file `saved`."""
    try:
        before = _flatten(tomllib.loads(saved.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return ""
    now = _flatten(tomllib.loads(config_to_toml(cfg)))
    diffs = [f"{key} ({before.get(key, 'unset')!r} -> {now.get(key, 'unset')!r})"
             for key in sorted(before.keys() | now.keys()) if before.get(key) != now.get(key)]
    return ", ".join(diffs[:show]) + (f" and {len(diffs) - show} more" if len(diffs) > show else "")


def _flatten(table: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def finished_message(out_dir: Path, cfg: Config, state: TrainerState, summary: dict) -> str:
    """What --resume of a finished run says (it changes nothing), and how to train on."""
    if state.stopped_early:
        why, more = "it stopped early (eval.early_stop_patience)", "raise eval.early_stop_patience"
    elif state.step >= cfg.train.max_steps:
        why, more = f"train.max_steps = {cfg.train.max_steps}", f"--set train.max_steps=N (N > {state.step})"
    else:
        why, more = f"train.max_minutes = {cfg.train.max_minutes} is spent", "raise train.max_minutes"
    metric = summary.get("metric", "accuracy")
    scores = " -> ".join(_score(summary.get(when) or {}, metric) for when in ("initial", "final"))
    return (f"{out_dir} is already finished at step {state.step} ({why}; {metric} {scores}): nothing to do; "
            f"to train on, resume with {more}")


def _score(result: dict, metric: str) -> str:
    value = result.get("score", result.get(metric))
    return f"{value:.3f}" if isinstance(value, (int, float)) else "?"


def saved_eval(saved: dict) -> EvalResult:
    """An EvalResult from its to_dict() (which may add derived keys, such as the score)."""
    names = {f.name for f in fields(EvalResult)}
    return EvalResult(**{key: value for key, value in saved.items() if key in names})


def read_summary(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_summary(out_dir: Path, summary: dict) -> None:
    _write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
