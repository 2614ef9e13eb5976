"""Models: the offline tiny model and character tokenizer, the model/tokenizer loader, LoRA.

Names are imported lazily so `import tandemrl.models.lora` does not pull in the rest.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_char_tokenizer": "tandemrl.models.tokenizer",
    "VOCAB_SIZE": "tandemrl.models.tokenizer",
    "make_tiny_model": "tandemrl.models.tiny",
    "ensure_tiny_model": "tandemrl.models.tiny",
    "ModelLoadError": "tandemrl.models.load",
    "load_model": "tandemrl.models.load",
    "load_tokenizer": "tandemrl.models.load",
    "load_config": "tandemrl.models.load",
    "resolve_device": "tandemrl.models.load",
    "resolve_dtype": "tandemrl.models.load",
    "resolve_name_or_path": "tandemrl.models.load",
    "LoraSettings": "tandemrl.models.lora",
    "apply_lora": "tandemrl.models.lora",
    "unwrap_causal_lm": "tandemrl.models.lora",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tandemrl.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
