"""What a run is given besides its config (the Python API's objects), and the checks of its prompts.

A config file can only name things (a model path, a data file, ``module:function``); the Python API can also pass the
objects themselves: a ``PreTrainedModel``, in-memory datasets, reward callables. They travel in :class:`RunInputs`.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandemrl.config import Config
from tandemrl.data.loading import TaskData, check_batch_fits, load_data
from tandemrl.rewards.composite import CompositeReward, build_reward
from tandemrl.rewards.names import INLINE_REWARD
from tandemrl.train.rollouts import PromptEncoder, PromptTooLong
from tandemrl.types import Sample


@dataclass
class RunInputs:
    model: Any = None  # a transformers PreTrainedModel (config: model.name_or_path names it)
    tokenizer: Any = None
    train_dataset: Any = None  # a list of dicts or a datasets.Dataset (config: data.path)
    eval_dataset: Any = None
    reward_funcs: dict[str, Callable[..., Any]] = field(default_factory=dict)  # name -> callable
    tools: dict[str, Callable[..., Any]] = field(default_factory=dict)  # tools.names entry -> callable


def run_data(cfg: Config, inputs: RunInputs) -> TaskData:
    data = load_data(cfg.data, cfg.train.seed, cfg.eval.limit, inputs.train_dataset, inputs.eval_dataset)
    check_batch_fits(data.train, cfg.rollout.prompts_per_step, _train_origin(cfg, inputs))
    return data


def _train_origin(cfg: Config, inputs: RunInputs) -> str:
    if inputs.train_dataset is not None:
        return "the train_dataset"
    return f"data.path {cfg.data.path}" if cfg.data.path else f"data.task {cfg.data.task_name}"


def run_reward(cfg: Config, inputs: RunInputs) -> CompositeReward:
    """The config's reward functions and weights, with the API's callables standing in for their names
    (``inline:<name>``, which no file can load)."""
    return build_reward(cfg.reward.components(), inputs.reward_funcs)


def reward_record(fn: Callable[..., Any]) -> str:
    """How a config names a reward (or tool) callable: ``path/to/file.py:function`` when it lives in an importable file of
    its own (not the running script, which loading would run again), else ``inline:<name>``."""
    name = getattr(fn, "__name__", type(fn).__name__)
    module = inspect.getmodule(fn)
    source = inspect.getsourcefile(fn) if module is not None and module.__name__ != "__main__" else None
    if source is None or name == "<lambda>" or getattr(module, name, None) is not fn:
        return f"{INLINE_REWARD}{name}"
    return f"{source}:{name}"


def has_answer(samples: list[Sample]) -> bool:
    return any(s.answer is not None or "answer" in s.columns for s in samples)


def fitting_prompts(encoder: PromptEncoder, samples: list[Sample], policy: str) -> tuple[list[Sample], int]:
    """The samples whose prompt fits ``encoder.max_tokens`` and how many were left out. ``policy``: ``error``
    raises on the first one that does not fit (naming its row), ``skip`` leaves it out."""
    kept: list[Sample] = []
    for sample in samples:
        try:
            encoder.encode(sample)
        except PromptTooLong as err:
            if policy == "error":
                raise PromptTooLong(f"{err}; shorten it, raise data.max_prompt_tokens, or set "
                                    "data.long_prompts = \"skip\" to leave such rows out") from None
            continue
        kept.append(sample)
    return kept, len(samples) - len(kept)


def inline_data_path(out_dir: Path, split: str) -> Path:
    """Where a run keeps a copy of an in-memory dataset, so that `tandemrl eval RUN_DIR` finds its data."""
    return out_dir / "data" / f"{split}.jsonl"


def write_inline_datasets(out_dir: Path, inputs: RunInputs | None) -> None:
    """The API's in-memory datasets as jsonl in the run directory (the config's data.path points there)."""
    if inputs is None:
        return
    for split, rows in (("train", inputs.train_dataset), ("test", inputs.eval_dataset)):
        if rows is None or isinstance(rows, (str, os.PathLike)):
            continue
        path = inline_data_path(out_dir, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(dict(row), ensure_ascii=False) + "\n")
        os.replace(tmp, path)
