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
    if resume and not out_dir.is_dir():  # (a directory without a checkpoint yet: a kill in the first save)
        raise FileNotFoundError(f"resume: {out_dir} holds no run to resume (no such directory); to start a new run "
                                "there, drop --resume (Python: train() without resume=True)")
    # only a complete checkpoint counts: a kill during the first save leaves just a .tmp-* folder
    if not resume and find_latest(out_dir / "checkpoints") is not None:
        # state_io serves the CLI and the Python API alike: the message names both ways
        raise FileExistsError(
            f"{out_dir} already holds a run with checkpoints; to continue it pass --resume (Python: "
            "Trainer(...).train(resume=True)), or choose another run directory (--out; Python: out_dir=)"
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


# Keys whose new value a resume applies without touching what the checkpoint must fit: a longer run, another
# learning rate or schedule (re-applied over the optimizer's saved one in _apply_optimizer_settings), evaluation,
# logging and checkpointing. A prefix ending in "." covers its whole section.
RESUMABLE_KEYS = ("train.max_steps", "train.max_minutes", "train.lr", "train.lr_schedule", "train.warmup_steps",
                  "train.adam_betas", "train.weight_decay", "eval.", "log.", "checkpoint.")

Change = tuple[str, object, object]  # (dotted key, value in the run's config.toml, value now)


def restore_run(run: Run) -> TrainerState | None:
    """The state of the latest complete checkpoint, loaded into `run`; None if no save ever finished. A checkpoint
    that does not fit the config raises ResumeRefused, naming the changed keys that may block it (and, apart, the
    changed keys a resume allows). A resume says which checkpoint it continues from and what changed."""
    path = find_latest(run.out_dir / "checkpoints")
    if path is None:
        return None
    changes = changed_keys(run.out_dir / "config.toml", run.cfg)
    try:
        state = _restore(run, path)
    except (ValueError, CheckpointError) as exc:
        raise ResumeRefused(refusal_message(run.out_dir, path, exc, changes)) from exc
    _apply_optimizer_settings(run)
    if run.parallel.is_main and not _finished(run.cfg, state):  # a finished run says so in its own single line
        from rich.console import Console

        Console().print(resume_message(run.out_dir, path, state.step, changes), markup=False, highlight=False,
                        soft_wrap=True)
    return state


def _finished(cfg: Config, state: TrainerState) -> bool:
    """Whether the resumed run has no step left (the loop's own test, at the checkpoint's clock)."""
    limit = cfg.train.max_minutes
    out_of_time = limit is not None and state.seconds >= 60 * limit
    return state.final_eval is not None and (state.step >= cfg.train.max_steps or state.stopped_early or out_of_time)


def resumable(key: str) -> bool:
    """Whether a resume may change ``key`` (see RESUMABLE_KEYS)."""
    return any(key.startswith(k) if k.endswith(".") else key == k for k in RESUMABLE_KEYS)


def refusal_message(out_dir: Path, path: Path, exc: Exception, changes: list[Change]) -> str:
    """Why the checkpoint does not fit: the error, the changed keys that may block it, the allowed ones apart."""
    blocking = [c for c in changes if not resumable(c[0])]
    allowed = [c for c in changes if resumable(c[0])]
    text = f"cannot resume {out_dir} from {path.name}: {exc}"
    if blocking:
        text += f"; keys that differ from {out_dir / 'config.toml'} and may block it: {format_changes(blocking)}"
    text += "; nothing was changed"
    if blocking:
        text += " (resume without the --set/--config that changed those keys"
        text += f"; these may change on resume: {format_changes(allowed)})" if allowed else ")"
    return text


def resume_message(out_dir: Path, path: Path, step: int, changes: list[Change]) -> str:
    """What a resume continues from, and every key that differs from the run's config.toml (nothing silently)."""
    text = f"resuming {out_dir} from step {step} ({path})"
    if changes:
        text += f"; changed since its config.toml: {format_changes(changes, show=len(changes))}"
    return text


def _apply_optimizer_settings(run: Run) -> None:
    """The config's learning rate, betas and weight decay over the ones the optimizer and scheduler states brought
    back from the checkpoint (loading them would otherwise keep the old values: a changed train.lr would be
    silently ignored). Values already equal leave the restored state untouched, so an unchanged resume is exact."""
    train = run.cfg.train
    scheduler = run.scheduler
    for index, group in enumerate(run.optimizer.param_groups):
        if group.get("betas") is not None and tuple(group["betas"]) != tuple(train.adam_betas):
            group["betas"] = tuple(train.adam_betas)
        if group.get("weight_decay") != train.weight_decay:
            group["weight_decay"] = train.weight_decay
        if group.get("initial_lr", train.lr) != train.lr:
            group["initial_lr"] = train.lr
            scheduler.base_lrs[index] = train.lr
            group["lr"] = train.lr * scheduler.lr_lambdas[index](scheduler.last_epoch)
            scheduler._last_lr = [g["lr"] for g in run.optimizer.param_groups]  # what get_last_lr() reports


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


def changed_keys(saved: Path, cfg: Config) -> list[Change]:
    """Where `cfg` differs from the config file `saved`, key by key (sorted); [] if the file cannot be read."""
    try:
        before = _flatten(tomllib.loads(saved.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return []
    now = _flatten(tomllib.loads(config_to_toml(cfg)))
    return [(key, before.get(key, "unset"), now.get(key, "unset"))
            for key in sorted(before.keys() | now.keys()) if before.get(key) != now.get(key)]


def format_changes(changes: list[Change], show: int = 5) -> str:
    """'data.task ('synthetic:add' -> 'synthetic:copy'), ...', the first ``show`` of them."""
    text = ", ".join(f"{key} ({old!r} -> {new!r})" for key, old, new in changes[:show])
    return text + (f" and {len(changes) - show} more" if len(changes) > show else "")


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
