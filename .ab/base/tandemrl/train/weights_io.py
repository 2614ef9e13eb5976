"""Reading a checkpoint's model weights (full safetensors or PEFT adapters) and copying them into a live model.

Everything is checked before anything is copied; the copy goes into the model's existing tensors, in place.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_SHOW = 5  # how many mismatching keys an error names


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which, where, and what is left intact."""


def read_json(file: Path) -> dict:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} holds a {type(value).__name__}, expected a JSON object")
    return value


def is_peft_model(model: Any) -> bool:
    peft = sys.modules.get("peft")  # a PeftModel exists only if peft was imported: don't pay for importing it
    return peft is not None and isinstance(model, peft.PeftModel)


def prepare_model_load(path: Path, model: Any) -> Callable[[], None]:
    """Read and check the weights; return a function that copies them in place."""
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    has_adapter = (path / "adapter_model.safetensors").is_file()
    if is_peft_model(model):
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
        weight_map = read_json(index).get("weight_map") or {}
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


def _prepare_full_load(path: Path, model: torch.nn.Module) -> Callable[[], None]:
    from safetensors import safe_open

    saved = _safetensors_shapes(path)
    targets = model.state_dict(keep_vars=True)
    unexpected = sorted(k for k in saved if k not in targets)
    loaded_storage = {_storage_id(targets[k]) for k in saved if k in targets}
    # save_pretrained writes tied weights (lm_head tied to embed_tokens) once; the other name shares storage
    missing = [k for k in targets if k not in saved and _storage_id(targets[k]) not in loaded_storage]
    _raise_on_mismatch(path, missing, unexpected, {k: shape for k, (_, shape) in saved.items()}, targets)

    def apply() -> None:
        by_file: dict[Path, list[str]] = {}
        for key, (file, _) in saved.items():
            by_file.setdefault(file, []).append(key)
        with torch.no_grad():
            for file, keys in by_file.items():
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for key in keys:  # one tensor at a time: peak extra memory is the largest tensor
                        targets[key].copy_(f.get_tensor(key))

    return apply


def _prepare_adapter_load(path: Path, model: Any) -> Callable[[], None]:
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
