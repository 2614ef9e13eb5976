"""The Python API: ``Trainer(model=..., train_dataset=..., reward_funcs=[...]).train()``.

The CLI is a thin layer over it. Nothing global: each Trainer holds its own config, model and data, so two trainers
in one process do not see each other.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tandemrl.config import Config, ConfigError, validate_config
from tandemrl.config.loading import check_keys, read_toml, set_key
from tandemrl.train.inputs import INLINE_REWARD, RunInputs, inline_data_path, reward_record

ConfigLike = Config | Mapping[str, Any] | str | os.PathLike | None
RewardLike = str | Callable[..., Any]
ToolLike = str | Callable[..., Any]


class Trainer:
    """GRPO on a model, a dataset and reward functions.

    Args:
        model: a hub id, a local directory, a ``.gguf`` file, ``"tiny"`` (the offline test model) or a
            transformers ``PreTrainedModel`` (then pass its ``tokenizer`` too, unless its ``name_or_path`` has one).
            None: the config's ``model.name_or_path``.
        train_dataset: a .jsonl/.json/.parquet/.csv file, a folder (``<split>.jsonl`` files, or saved by
            ``datasets``), a hub dataset id, a list of dicts or a ``datasets.Dataset``. Each row has a ``prompt``
            (text, or a list of chat messages) and any other columns, which reach the reward functions by name.
            None: the config's ``data.path`` / ``data.task``.
        reward_funcs: reward functions with TRL's contract (``fn(prompts, completions, completion_ids, **columns)
            -> list[float | None]``, called by keyword; ``async def`` allowed), registered names such as
            ``"accuracy"``, ``"module:function"`` or ``"path/to/file.py:function"``. None: ``reward.functions``.
        reward_weights: one weight per reward function (default 1.0 each), as TRL's ``reward_weights``. Or give
            the config's ``reward.weights``, by name: a callable's name is its ``__name__``.
        tools: tools the model may call in multi-turn rollouts, as TRL's ``tools``: typed Python functions whose
            docstring describes them (``async def`` allowed), built-in names such as ``"calculator"``,
            ``"module:function"`` or ``"path/to/file.py:function"`` (docs/tools.md). None: ``tools.names``.
        eval_dataset: the test set, in any form ``train_dataset`` takes. None: the dataset's test split, else a
            held-out ``data.test_fraction`` of ``train_dataset``.
        config: a :class:`Config`, a dict of settings (nested ``{"train": {"lr": 1e-5}}`` or dotted
            ``{"train.lr": 1e-5}``), or the path of a TOML file. The arguments above override it.
        out_dir: the run directory (default ``runs/<task>-<time>``).
    """

    def __init__(self, model: Any = None, train_dataset: Any = None, reward_funcs: Sequence[RewardLike] | None = None,
                 *, reward_weights: Sequence[float] | None = None, tools: Sequence[ToolLike] | None = None,
                 eval_dataset: Any = None,
                 config: ConfigLike = None, out_dir: str | os.PathLike | None = None, tokenizer: Any = None) -> None:
        from tandemrl.train.setup import default_out_dir

        raw = _raw_config(config)
        out = Path(out_dir) if out_dir is not None else None
        self.inputs = RunInputs(tokenizer=tokenizer)
        _set_model(raw, self.inputs, model)
        self.config = validate_config(raw)  # the out dir's default names the task: validate once without data
        self.out_dir = out or (Path(self.config.log.out_dir) if self.config.log.out_dir else
                               default_out_dir(self.config))
        _set_data(raw, self.inputs, train_dataset, eval_dataset, self.out_dir)
        _set_rewards(raw, self.inputs, reward_funcs, reward_weights)
        _set_tools(raw, self.inputs, tools)
        self.config = validate_config(raw)

    def train(self, resume: bool = False) -> dict:
        """Run GRPO; returns the summary (also in ``out_dir/summary.json``): the initial and final evaluations,
        steps, seconds. ``resume``: continue the run in ``out_dir`` from its latest checkpoint."""
        from tandemrl.train.loop import train

        return train(self.config, self.out_dir, resume=resume, inputs=self.inputs)

    def evaluate(self, dataset: Any = None, checkpoint: str | os.PathLike | None = None) -> dict:
        """Score a model on ``dataset`` (default: the run's test set): the eval.metric, accuracy (where the data has
        an ``answer`` column), reward and its functions, pass@k. ``checkpoint``: a checkpoint directory or this
        run's directory (its latest checkpoint); default: the run's latest checkpoint if it has one, else the
        starting model."""
        from tandemrl.train.eval_run import evaluate_config

        inputs = self.inputs
        if dataset is not None:
            inputs = dataclasses.replace(inputs, eval_dataset=dataset)
        source = Path(checkpoint) if checkpoint is not None else self.out_dir
        return evaluate_config(self.config, inputs, source).to_dict()


def _raw_config(config: ConfigLike) -> dict[str, Any]:
    """The user's keys as nested dicts (not yet validated): arguments are merged in before validation."""
    if config is None:
        return {}
    if isinstance(config, Config):
        return config.model_dump(exclude_unset=True)
    if isinstance(config, (str, os.PathLike)):
        return read_toml(Path(config))  # validated with the arguments merged in
    if isinstance(config, Mapping):
        raw: dict[str, Any] = {}
        for key, value in config.items():
            set_key(raw, key, value, f"config key {key!r}")
        check_keys(raw, "Trainer(config=...)")
        return raw
    raise ConfigError(f"config must be a Config, a dict or a TOML file path; got {type(config).__name__}")


def _set_model(raw: dict[str, Any], inputs: RunInputs, model: Any) -> None:
    if model is None:
        return
    if isinstance(model, (str, os.PathLike)):
        set_key(raw, "model.name_or_path", str(model), "the model argument")
        return
    if not hasattr(model, "config") or not hasattr(model, "forward"):
        raise TypeError(f"model must be a hub id, a path or a transformers PreTrainedModel; got {type(model).__name__}")
    inputs.model = model
    set_key(raw, "model.name_or_path", getattr(model, "name_or_path", "") or type(model).__name__,
            "the model argument")


def _set_data(raw: dict[str, Any], inputs: RunInputs, train: Any, test: Any, out_dir: Path) -> None:
    for key, split, dataset in (("data.path", "train", train), ("data.test_path", "test", test)):
        if dataset is None:
            continue
        if isinstance(dataset, (str, os.PathLike)):
            set_key(raw, key, str(dataset), f"the {split} dataset argument")
            continue
        _check_serializable(dataset, f"{split} dataset")
        setattr(inputs, "train_dataset" if split == "train" else "eval_dataset", dataset)
        path = inline_data_path(out_dir, split).resolve()  # the run keeps a copy there
        set_key(raw, key, str(path), f"the {split} dataset argument")


def _check_serializable(rows: Any, what: str) -> None:
    for i, row in enumerate(rows, start=1):
        try:
            json.dumps(dict(row))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{what}, row {i}: cannot be saved as JSON with the run ({err}); give the dataset as a "
                             "file, or keep its columns to text, numbers, lists and dicts") from None


def _set_rewards(raw: dict[str, Any], inputs: RunInputs, funcs: Sequence[RewardLike] | None,
                 weights: Sequence[float] | None) -> None:
    if funcs is None:
        if weights is not None:
            raise ValueError("reward_weights needs reward_funcs: one weight per reward function")
        return
    if isinstance(funcs, (str, bytes)) or callable(funcs):
        funcs = [funcs]  # type: ignore[list-item]
    if weights is not None and len(weights) != len(funcs):
        raise ValueError(f"reward_weights has {len(weights)} values for {len(funcs)} reward_funcs")
    names = []
    for fn in funcs:
        name = fn if isinstance(fn, str) else reward_record(fn)
        if name in names:
            name = f"{INLINE_REWARD}{len(names)}-{getattr(fn, '__name__', 'reward')}"
        if not isinstance(fn, str):
            inputs.reward_funcs[name] = fn
        names.append(name)
    section = raw.setdefault("reward", {})
    given = section.get("weights") or {}
    if weights is not None and given:
        raise ConfigError(f"reward weights are given twice, as reward_weights={list(weights)} and as the config's "
                          f"reward.weights = {given}: keep one")
    section["functions"] = names  # the arguments replace the config's reward functions; the config's weights stay
    if weights is not None:  # (by name: a callable's name is its __name__, reward.weights's rule in config/reward.py)
        section["weights"] = dict(zip(names, weights))


def _set_tools(raw: dict[str, Any], inputs: RunInputs, tools: Sequence[ToolLike] | None) -> None:
    """The tools replace the config's ``tools.names``; a callable is recorded as its file's ``file.py:function``
    or as ``inline:<name>`` (as a reward callable is) and travels in ``inputs.tools``."""
    if tools is None:
        return
    if isinstance(tools, (str, bytes)) or callable(tools):
        tools = [tools]  # type: ignore[list-item]
    names = []
    for tool in tools:
        if not isinstance(tool, str) and not callable(tool):
            raise TypeError(f"tools: each tool is a function or a name, got {type(tool).__name__} ({tool!r})")
        name = tool if isinstance(tool, str) else reward_record(tool)
        if name in names:
            raise ValueError(f"tools: {name!r} is given twice")
        if not isinstance(tool, str):
            inputs.tools[name] = tool
        names.append(name)
    raw.setdefault("tools", {})["names"] = names
