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

import json
import os
import pickle
import re
import shutil
import sys
import uuid
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from tandemrl.train.rng import capture_rng_state, restore_rng_state

COMPLETE = "COMPLETE"
LATEST = "latest"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
RNG = "rng.pt"
META_KEY = "_checkpoint"  # reserved key inside trainer_state.json
FORMAT = 1

_STEP_RE = re.compile(r"^step-(\d{8,})$")
_TMP_RE = re.compile(r"^\.tmp-step-(\d{8,})-(\d+)$")
_OLD_RE = re.compile(r"^\.old-step-(\d{8,})-(\d+)$")
_TRASH_PREFIX = ".trash-"
_SHOW = 5  # how many mismatching keys an error names


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which, where, and what is left intact."""


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
    pid = os.getpid()
    tmp = root / f".tmp-{name}-{pid}"
    aside: Path | None = None
    renamed = published = False
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(tmp):
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_contents(tmp, model, tokenizer, optimizer, scheduler, rng_state, state_text)
        _fsync_tree(tmp)
        _write_complete(tmp, step)
        if os.path.lexists(final):  # an earlier save of this step: keep it until the new one is in place
            aside = root / f".old-{name}-{pid}"
            if os.path.lexists(aside):
                shutil.rmtree(aside)
            os.replace(final, aside)
        os.replace(tmp, final)
        renamed = True
        _fsync_dir(root)
        _write_latest(root, name)
        published = True
        _fsync_dir(root)
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
    if _is_peft_model(model):
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
        torch.save(optimizer.state_dict(), folder / OPTIMIZER)
    if scheduler is not None:
        torch.save(scheduler.state_dict(), folder / SCHEDULER)
    torch.save(rng_state, folder / RNG)
    with open(folder / TRAINER_STATE, "w", encoding="utf-8") as f:
        f.write(state_text)


def _write_complete(folder: Path, step: int) -> None:
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        files[path.relative_to(folder).as_posix()] = path.stat().st_size
    manifest = {"format": FORMAT, "step": step, "files": files}
    _write_synced(folder / COMPLETE, json.dumps(manifest, indent=1) + "\n")
    _fsync_dir(folder)


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f"{LATEST}.tmp"
    _write_synced(tmp, name + "\n")
    os.replace(tmp, root / LATEST)


def _undo(root: Path, tmp: Path, final: Path, renamed: bool, aside: Path | None) -> None:
    """Best effort: remove what this save wrote, put back a folder it moved aside."""
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        if renamed:
            _remove_dir(root, final)
        if aside is not None and os.path.lexists(aside) and not os.path.lexists(final):
            os.replace(aside, final)
        try:
            os.unlink(root / f"{LATEST}.tmp")
        except FileNotFoundError:
            pass
        if root.is_dir():
            _fsync_dir(root)
    except Exception as exc:  # the original error matters more; find_latest still skips whatever is left
        warnings.warn(f"cleaning up after a failed checkpoint save under {root} failed: {exc}", stacklevel=3)


def _cleanup(root: Path, step: int, keep_last: int | None, aside: Path | None) -> None:
    """After a successful save: drop the replaced folder, old steps beyond keep_last, leftovers of crashes."""
    try:
        if aside is not None:
            _remove_dir(root, aside)
        older = sorted(
            ((int(m.group(1)), root / e.name) for e in os.scandir(root) if (m := _STEP_RE.match(e.name))),
            reverse=True,
        )
        older = [(s, p) for s, p in older if s < step]  # newer folders (an abandoned branch) are left alone
        if keep_last is not None:
            for _, path in older[keep_last - 1 :]:
                _remove_dir(root, path)
        for entry in os.scandir(root):
            match = _TMP_RE.match(entry.name) or _OLD_RE.match(entry.name)
            if match and (int(match.group(2)) == os.getpid() or not _pid_alive(int(match.group(2)))):
                _remove_dir(root, root / entry.name)
            elif entry.name.startswith(_TRASH_PREFIX):
                shutil.rmtree(root / entry.name, ignore_errors=True)
    except Exception as exc:
        warnings.warn(f"checkpoint saved, but pruning old checkpoints under {root} failed: {exc}", stacklevel=3)


def _remove_dir(root: Path, path: Path) -> None:
    """Rename to .trash-* first (atomic), so a kill during the delete never leaves a half checkpoint visible."""
    trash = root / f"{_TRASH_PREFIX}{path.name.lstrip('.')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0 or os.name == "nt":
        return os.name == "nt"  # on Windows os.kill(pid, 0) would terminate the process: assume alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ------------------------------------------------------------------------------------------------ durability


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str | Path) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync there
        return
    _fsync_file(path)


def _fsync_tree(folder: Path) -> None:
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for filename in filenames:
            _fsync_file(os.path.join(dirpath, filename))
        _fsync_dir(dirpath)


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
        elif match := _OLD_RE.match(entry.name):  # an earlier save of a step being re-saved when a kill landed
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
    return dict(_read_json(Path(path) / TRAINER_STATE).get(META_KEY) or {})


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
        raise CheckpointError(
            f"cannot load checkpoint {path}: {problem}; pass a folder that find_latest(root) returns"
        )
    trainer_state = _read_json(path / TRAINER_STATE)
    trainer_state.pop(META_KEY, None)
    optimizer_state = _load_pt(path, OPTIMIZER, "an optimizer") if optimizer is not None else None
    scheduler_state = _load_pt(path, SCHEDULER, "a scheduler") if scheduler is not None else None
    rng_state = _load_pt(path, RNG, "RNG state") if restore_rng else None

    apply_weights = _prepare_model_load(path, model)
    apply_weights()
    if optimizer is not None:
        try:
            optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise CheckpointError(f"cannot load {path / OPTIMIZER} into {type(optimizer).__name__}: {exc}") from exc
    if scheduler is not None:
        try:
            scheduler.load_state_dict(scheduler_state)
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise CheckpointError(f"cannot load {path / SCHEDULER} into {type(scheduler).__name__}: {exc}") from exc
    if rng_state is not None:
        restore_rng_state(rng_state)
    return trainer_state


def _read_json(file: Path) -> dict:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} holds a {type(value).__name__}, expected a JSON object")
    return value


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


def _is_peft_model(model: Any) -> bool:
    peft = sys.modules.get("peft")  # a PeftModel exists only if peft was imported: don't pay for importing it
    return peft is not None and isinstance(model, peft.PeftModel)


def _prepare_model_load(path: Path, model: Any):
    """Read and check the weights; return a function that copies them in place."""
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    has_adapter = (path / "adapter_model.safetensors").is_file()
    if _is_peft_model(model):
        if not has_adapter:
            raise CheckpointError(
                f"checkpoint {path} holds full model weights but the model is a PeftModel; load it into the base "
                "model (model.get_base_model()) or resume with the same LoRA setup it was saved with"
            )
        return _prepare_adapter_load(path, model)
    if has_adapter:
        raise CheckpointError(
            f"checkpoint {path} holds a PEFT adapter, not full weights; wrap the base model with the same LoRA "
            "config (peft.get_peft_model) before loading"
        )
    return _prepare_full_load(path, model)


def _safetensors_shapes(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """key -> (file, shape) for the model weights, from the headers only (nothing is read into memory)."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map") or {}
        files, listed = sorted({folder / shard for shard in weight_map.values()}), set(weight_map)
    elif single.is_file():
        files, listed = [single], None
    else:
        raise CheckpointError(f"checkpoint {folder} has neither model.safetensors nor model.safetensors.index.json")
    found: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    found[key] = (file, tuple(f.get_slice(key).get_shape()))
        except Exception as exc:
            raise CheckpointError(f"cannot read {file}: {exc}") from exc
    if listed is not None and (absent := sorted(listed - set(found))):
        raise CheckpointError(f"{index} lists tensors its shards do not hold: {absent[:_SHOW]}")
    return found


def _prepare_full_load(path: Path, model: torch.nn.Module):
    saved = _safetensors_shapes(path)
    targets = model.state_dict(keep_vars=True)
    unexpected = sorted(k for k in saved if k not in targets)
    loaded_storage = {_storage_id(targets[k]) for k in saved if k in targets}
    # save_pretrained writes tied weights (lm_head tied to embed_tokens) once; the other name shares storage
    missing = [k for k in targets if k not in saved and _storage_id(targets[k]) not in loaded_storage]
    _raise_on_mismatch(path, missing, unexpected, {k: shape for k, (_, shape) in saved.items()}, targets)

    def apply() -> None:
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for key, (file, _) in saved.items():
            by_file.setdefault(file, []).append(key)
        with torch.no_grad():
            for file, keys in by_file.items():
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for key in keys:  # one tensor at a time: peak extra memory is the largest tensor
                        targets[key].copy_(f.get_tensor(key))

    return apply


def _prepare_adapter_load(path: Path, model: Any):
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    loaded = []
    for name in model.peft_config:
        file = (path if name == "default" else path / name) / "adapter_model.safetensors"
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} has no weights for the adapter {name!r} (no {file})")
        saved = load_file(file)  # adapters are small
        expected = get_peft_model_state_dict(model, adapter_name=name)
        missing = [k for k in expected if k not in saved]
        unexpected = sorted(k for k in saved if k not in expected)
        _raise_on_mismatch(file, missing, unexpected, {k: tuple(v.shape) for k, v in saved.items()}, expected)
        loaded.append((name, saved, file))

    def apply() -> None:
        for name, saved, file in loaded:
            result = set_peft_model_state_dict(model, saved, adapter_name=name)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            if unexpected:
                raise CheckpointError(f"{file}: the model did not take {len(unexpected)} keys: {unexpected[:_SHOW]}")

    return apply


def _storage_id(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.data_ptr(), tuple(tensor.shape))


def _raise_on_mismatch(where: Path, missing: list, unexpected: list, saved_shapes: dict, targets: dict) -> None:
    shapes = [
        f"{k}: saved {shape}, model {tuple(targets[k].shape)}"
        for k, shape in saved_shapes.items()
        if k in targets and shape != tuple(targets[k].shape)
    ]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing keys (in the model, not the checkpoint): {missing[:_SHOW]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys (in the checkpoint, not the model): {unexpected[:_SHOW]}")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatches: {shapes[:_SHOW]}")
    raise CheckpointError(f"checkpoint {where} does not fit the model: " + "; ".join(parts))
