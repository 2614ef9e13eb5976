"""tandemrl: GRPO post-training of language models with fast, observable rollouts.

The public API::

    from tandemrl import Trainer

    trainer = Trainer(model="Qwen/Qwen2.5-0.5B-Instruct", train_dataset="train.jsonl", reward_funcs=[my_reward])
    summary = trainer.train()

Names are imported on first use, so that ``import tandemrl`` (and the CLI's start) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Trainer": "tandemrl.api",
    "Config": "tandemrl.config",
    "ConfigError": "tandemrl.config",
    "load_config": "tandemrl.config",
    "EvalResult": "tandemrl.train.evaluate",
    "DatasetError": "tandemrl.data.sources",
    "register_reward": "tandemrl.rewards.functions",
    "completion_text": "tandemrl.rewards.functions",
    "SamplingParams": "tandemrl.types",
    "Rollout": "tandemrl.types",
    "Sample": "tandemrl.types",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tandemrl' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
