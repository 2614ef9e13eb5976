"""Atomic checkpoints of the whole trainer state, and exact resume from them.

Layout under a checkpoint root::

    root/
      step-00000120/              one complete checkpoint
        config.json, model.safetensors       the model, Hugging Face layout (or sharded: an index + shards);
                                              for a PEFT model: adapter_config.json + adapter_model.safetensors
                                              (other adapters than "default" in a subfolder named after them)
        tokenizer.json, tokenizer_config.json, ...
        optimizer.pt, scheduler.pt, rng.pt    torch.save of the state dicts and of capture_rng_state()
        trainer_state.json                    the caller's dict, plus "_checkpoint" (format, model kind, versions)
        COMPLETE                              written last: JSON list of every file and its size
      latest                                  "step-00000120", replaced atomically

How a save stays atomic: everything is written into ``root/.tmp-step-N-<pid>``, every file and folder is
fsync'ed, COMPLETE is written and fsync'ed, the folder is renamed to ``step-N`` and the root fsync'ed, and only
then is ``latest`` replaced (write ``latest.tmp``, fsync, ``os.replace``). A kill at any moment leaves either the
old or the new ``latest``, each naming a complete folder. Re-saving an existing step moves the old folder aside
(``.old-step-N-<pid>``) first; ``find_latest`` still accepts that folder should a kill land in between. Folders
are deleted by renaming them to ``.trash-...`` first, so a half-deleted folder never looks like a checkpoint.

Not supported: two processes saving into one root at the same time (multi-GPU runs save from rank 0 only).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from tandemrl.train import atomic_dir
from tandemrl.train.rng import capture_rng_state, restore_rng_state
from tandemrl.train.weights_io import CheckpointError, is_peft_model, prepare_model_load, read_json

COMPLETE = "COMPLETE"
LATEST = "latest"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
RNG = "rng.pt"
META_KEY = "_checkpoint"  # reserved key inside trainer_state.json
FORMAT = 1

_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


# ----------------------------------------------------------------------------------------------------- save


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    trainer_state: dict,
    keep_last: int | None = 2,
) -> Path:
    """Write ``root/step-{step:08d}/`` atomically and point ``root/latest`` at it; returns that folder.

    `tokenizer`, `optimizer` and `scheduler` may be None (their files are then absent). `trainer_state` must be
    JSON-serialisable (checked before anything is written). After the save, `step-*` folders older than the
    new one beyond `keep_last` (the new one counts; None keeps all) and leftovers of crashed saves are deleted.
    """
    rng_state = capture_rng_state()  # first, so nothing below can move a generator before it is recorded
    root = Path(root)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"keep_last must be an int >= 1 or None (keep all), got {keep_last!r}")
    state_text = _encode_trainer_state(trainer_state, _meta(step, model, optimizer, scheduler))

    name = step_dir_name(step)
    final = root / name
    previous = find_latest(root)
    tmp = atomic_dir.staging_path(root, name)
    aside: Path | None = None
    renamed = published = False
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_dir.clear(tmp)
        tmp.mkdir()
        _write_contents(tmp, model, tokenizer, optimizer, scheduler, rng_state, state_text)
        atomic_dir.fsync_tree(tmp)
        _write_complete(tmp, step)
        # an earlier save of this step: keep it until the new one is in place
        aside = atomic_dir.move_aside(root, final)
        os.replace(tmp, final)
        renamed = True
        atomic_dir.fsync_dir(root)
        _write_latest(root, name)
        published = True
        atomic_dir.fsync_dir(root)
    except BaseException as exc:
        if published and isinstance(exc, Exception):  # only the last fsync failed: the new checkpoint is current
            warnings.warn(f"checkpoint {final} is written, but syncing {root} failed: {exc}", stacklevel=2)
            _cleanup(root, step, keep_last, aside)
            return final
        if not published:
            _undo(root, tmp, final, renamed, aside)
        if not isinstance(exc, Exception):
            raise
        kept = f"the previous checkpoint {previous.name} is intact" if previous else "there is no previous checkpoint"
        raise CheckpointError(f"could not write checkpoint step {step} to {final}: {_reason(exc)}; {kept}") from exc
    _cleanup(root, step, keep_last, aside)
    return final


def _meta(step: int, model: Any, optimizer: Any, scheduler: Any) -> dict:
    import transformers

    meta = {
        "format": FORMAT,
        "step": step,
        "model_format": "full",
        "model_class": type(model).__name__,
        "has_optimizer": optimizer is not None,
        "has_scheduler": scheduler is not None,
        "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if is_peft_model(model):
        meta["model_format"] = "peft_adapter"
        meta["adapters"] = list(model.peft_config)
        meta["note"] = (
            "model weights are the PEFT adapter(s) only; load them into a PeftModel built on the same base weights"
        )
    return meta


def _encode_trainer_state(trainer_state: dict, meta: dict) -> str:
    if not isinstance(trainer_state, dict):
        raise TypeError(f"trainer_state must be a dict, got {type(trainer_state).__name__}")
    if META_KEY in trainer_state:
        raise ValueError(f"trainer_state may not use the key {META_KEY!r}: the checkpoint writes its own there")
    _check_json(trainer_state, "trainer_state")
    return json.dumps({**trainer_state, META_KEY: meta}, indent=2) + "\n"


def _check_json(value: Any, where: str) -> None:
    """Raise TypeError naming the first value JSON cannot hold exactly (or would silently change, like int keys)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{where} has the key {key!r} of type {type(key).__name__}; JSON object keys must be str "
                    "(convert it, or it would come back as a string)"
                )
            _check_json(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]")
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise TypeError(
        f"{where} is a {kind}, which is not JSON-serialisable; convert it before saving "
        "(e.g. tensor.item() / .tolist(), int(numpy_int), str(path)), or keep it in a component state_dict"
    )


def _write_contents(
    folder: Path, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any, rng_state: dict, state_text: str
) -> None:
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if optimizer is not None:
        torch_save(optimizer.state_dict(), folder / OPTIMIZER)
    if scheduler is not None:
        torch_save(scheduler.state_dict(), folder / SCHEDULER)
    torch_save(rng_state, folder / RNG)
    with open(folder / TRAINER_STATE, "w", encoding="utf-8") as f:
        f.write(state_text)


class _FileWriter:
    """What torch.save writes through: every byte reaches the file, and the first OSError is kept, because torch's
    writer reports a failed write as "unexpected pos N vs M" and drops the cause (ENOSPC: the disk is full)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            self.error = self.error or exc
            raise
        return len(data)

    def flush(self) -> None:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def torch_save(obj: Any, path: Path) -> None:
    """torch.save(obj, path), raising the OSError of a failed write (not torch's "unexpected pos ...")."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    writer = _FileWriter(fd)
    try:
        torch.save(obj, writer)
    except RuntimeError as exc:
        if writer.error is not None:
            raise writer.error from exc
        raise
    finally:
        os.close(fd)


def _write_complete(folder: Path, step: int) -> None:
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "step": step, "files": files}
    atomic_dir.write_synced(folder / COMPLETE, json.dumps(manifest, indent=1) + "\n")
    atomic_dir.fsync_dir(folder)


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f"{LATEST}.tmp"
    atomic_dir.write_synced(tmp, name + "\n")
    os.replace(tmp, root / LATEST)


def _undo(root: Path, tmp: Path, final: Path, renamed: bool, aside: Path | None) -> None:
    """Best effort: remove what this save wrote, put back a folder it moved aside."""
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        if renamed:
            atomic_dir.remove_dir(root, final)
        if aside is not None and os.path.lexists(aside) and not os.path.lexists(final):
            os.replace(aside, final)
        (root / f"{LATEST}.tmp").unlink(missing_ok=True)
        if root.is_dir():
            atomic_dir.fsync_dir(root)
    except Exception as exc:  # the original error matters more; find_latest still skips whatever is left
        warnings.warn(f"cleaning up after a failed checkpoint save under {root} failed: {exc}", stacklevel=3)


def _cleanup(root: Path, step: int, keep_last: int | None, aside: Path | None) -> None:
    """After a successful save: drop the replaced folder, old steps beyond keep_last, leftovers of crashes."""
    try:
        if aside is not None:
            atomic_dir.remove_dir(root, aside)
        if keep_last is not None:
            steps = sorted((int(m.group(1)), e.name) for e in os.scandir(root) if (m := _STEP_RE.match(e.name)))
            older = [name for s, name in reversed(steps) if s < step]  # newer ones (an abandoned branch) stay
            for name in older[keep_last - 1 :]:
                atomic_dir.remove_dir(root, root / name)
        atomic_dir.sweep_leftovers(root, _STEP_RE)
    except Exception as exc:
        warnings.warn(f"checkpoint saved, but pruning old checkpoints under {root} failed: {exc}", stacklevel=3)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    # say it in words: "[Errno 28]" alone does not tell a user to free space
    return f"the disk is full: {reason}" if _disk_full(exc) else reason


def _disk_full(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT, as an OSError or in the text of a library's own error (safetensors: "os error 28")."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


# ------------------------------------------------------------------------------------------------- find


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint, or None if it is (COMPLETE present, every listed file intact)."""
    path = Path(path)
    if not path.is_dir():
        return "it does not exist" if not os.path.lexists(path) else "it is not a directory"
    try:
        manifest = json.loads((path / COMPLETE).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        return f"it has no {COMPLETE} marker (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {COMPLETE} marker is unreadable ({exc})"
    for rel, size in files.items():
        file = path / rel
        if not file.is_file():
            return f"the file {rel} is missing"
        actual = file.stat().st_size
        if actual != size:
            return f"the file {rel} has {actual} bytes, {size} expected"
    return None


def is_complete_checkpoint(path: Path) -> bool:
    return checkpoint_problem(path) is None


def find_latest(root: Path) -> Path | None:
    """The folder `root/latest` names if complete; else the newest complete `step-*` folder; else None."""
    root = Path(root)
    if not root.is_dir():
        return None
    name = _read_latest(root)
    if _STEP_RE.match(name) and is_complete_checkpoint(root / name):
        return root / name
    candidates = []
    for entry in os.scandir(root):
        if match := _STEP_RE.match(entry.name):
            candidates.append((int(match.group(1)), 1, root / entry.name))
        elif match := _STEP_RE.match(atomic_dir.moved_aside_from(entry.name) or ""):  # moved aside by a killed re-save
            candidates.append((int(match.group(1)), 0, root / entry.name))
    for _, _, path in sorted(candidates, reverse=True):
        if is_complete_checkpoint(path):
            return path
    return None


def _read_latest(root: Path) -> str:
    try:
        return (root / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def checkpoint_info(path: Path) -> dict:
    """The metadata save_checkpoint recorded (format, step, model_format, versions, ...)."""
    return dict(read_json(Path(path) / TRAINER_STATE).get(META_KEY) or {})


# ------------------------------------------------------------------------------------------------- load


def load_checkpoint(
    path: Path, *, model: Any, optimizer: torch.optim.Optimizer | None = None, scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict:
    """Load a checkpoint folder into existing objects and return the saved trainer_state.

    Weights are copied IN PLACE into the model's existing parameter tensors (a rollout engine may hold them),
    one tensor at a time. Completeness, the optimizer/scheduler/RNG files and the weight names and shapes are
    all checked before anything is changed; an optimizer that does not fit the saved state fails after the
    weights were copied.
    """
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"cannot load checkpoint {path}: {problem}; pass a folder that find_latest(root) returns")
    trainer_state = read_json(path / TRAINER_STATE)
    trainer_state.pop(META_KEY, None)
    components = [(optimizer, OPTIMIZER, "an optimizer"), (scheduler, SCHEDULER, "a scheduler")]
    states = [(obj, name, _load_pt(path, name, what)) for obj, name, what in components if obj is not None]
    rng_state = _load_pt(path, RNG, "RNG state") if restore_rng else None

    apply_weights = prepare_model_load(path, model)
    apply_weights()
    for obj, name, state in states:
        try:
            obj.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise CheckpointError(f"cannot load {path / name} into {type(obj).__name__}: {exc}") from exc
    if rng_state is not None:
        restore_rng_state(rng_state)
    return trainer_state


def _load_pt(folder: Path, name: str, what: str) -> Any:
    file = folder / name
    if not file.is_file():
        raise CheckpointError(f"checkpoint {folder} has no {name}: it was saved without {what}")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # e.g. a scheduler whose lr_lambda is a callable object: its __dict__ is pickled. The file was written
        # by save_checkpoint, so reading it in full is acceptable; say so rather than fail.
        warnings.warn(f"{file} needs full unpickling ({str(exc).splitlines()[0]}); loading it with weights_only=False")
        return torch.load(file, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc
