"""A local model directory's safetensors files, checked before transformers reads them: a truncated or damaged file
is one line naming it, not a SafetensorError traceback from deep inside from_pretrained."""

from __future__ import annotations

import json
from pathlib import Path

from tandemrl.models.load_errors import ModelLoadError


def check_weight_files(folder: Path) -> None:
    """Raise ModelLoadError naming the first safetensors file of `folder` whose header or size is wrong. Reads the
    headers only (safetensors checks that they cover the file exactly, which a truncation breaks)."""
    for file in _weight_files(folder):
        problem = safetensors_problem(file)
        if problem is not None:
            raise ModelLoadError(f"{file} is truncated or damaged ({problem}); copy or download it again")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index} is not a readable safetensors index ({exc}); copy or download it again")
        return sorted({folder / shard for shard in shards})
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def safetensors_problem(file: Path) -> str | None:
    """Why `file` is not a readable safetensors file, or None."""
    from safetensors import safe_open

    if not file.is_file():
        return "the file is missing"
    try:
        with safe_open(str(file), framework="pt") as f:
            f.keys()
    except Exception as exc:  # SafetensorError, or an OSError reading it
        return " ".join(str(exc).split())
    return None
