"""The run's train and test samples from the ``data`` config: a user's dataset (``data.path``) or a preset task.

The test set is, in this order: ``data.test_path`` (or the API's ``eval_dataset``); the ``data.test_split`` of a
folder or hub dataset that has one; else a seeded ``data.test_fraction`` of the training rows, held out and never
trained on. ``TaskData.test_origin`` says which, so the run can say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from tandemrl.data.dataset import hold_out, rows_to_samples
from tandemrl.data.gsm8k import load_gsm8k
from tandemrl.data.sources import DatasetError, describe_source, has_split, read_rows
from tandemrl.data.tasks import GSM8K_HUB_NAME, load_task
from tandemrl.types import Sample

USER_DATASET = "dataset"  # the task name of a user's own dataset (data.task unset, data.path set)
GENERATED_TASKS = ("arith2", "synthetic:")
Reader = Callable[..., list[Sample]]  # (source, split, key=the config key naming source) -> samples


@dataclass
class TaskData:
    train: list[Sample]
    test: list[Sample]
    test_origin: str  # where the test samples come from, in words
    test_rows: int  # before eval.limit


def task_name(task: str | None, path: Any) -> str:
    """The run's task: ``data.task``, else the user's dataset when there is one, else the offline demo."""
    if task is not None:
        return task
    return USER_DATASET if path is not None else "synthetic:add"


def load_data(data: Any, seed: int, eval_limit: int | None, train_source: Any = None,
              test_source: Any = None) -> TaskData:
    """``data``: the DataConfig. ``train_source``/``test_source`` (the Python API's in-memory datasets) stand in for
    ``data.path``/``data.test_path``."""
    train_source = train_source if train_source is not None else data.path
    test_source = test_source if test_source is not None else data.test_path
    task = task_name(data.task, train_source)
    if task.startswith(GENERATED_TASKS):
        if train_source is not None or test_source is not None:
            raise DatasetError(f"data.task = {task!r} generates its data: unset data.path and data.test_path "
                               "(or unset data.task to train on your own dataset)")
        train = load_task(task, data.train_split, limit=data.train_limit, seed=seed)
        test = load_task(task, data.test_split, limit=None, seed=seed)
        return _limited(TaskData(train, test, f"the {task} test split", len(test)), eval_limit)
    if task == "gsm8k":
        train_source = train_source if train_source is not None else GSM8K_HUB_NAME
        reader: Reader = load_gsm8k
    elif task == USER_DATASET:
        reader = partial(_user_samples, prompt_column=data.prompt_column, subset=data.subset)
    else:
        raise DatasetError(f"unknown task {task!r} (data.task); valid tasks: gsm8k, arith2, synthetic:add, "
                           "synthetic:copy, synthetic:add2, synthetic:peek; or unset it and give your own dataset as "
                           "data.path")
    split = _split_test(data, train_source, test_source, reader)
    split.train = split.train[: data.train_limit]
    return _limited(split, eval_limit)


def _user_samples(source: Any, split: str, key: str, *, prompt_column: str, subset: str | None) -> list[Sample]:
    return rows_to_samples(read_rows(source, split, subset, key), prompt_column, describe_source(source))


def _split_test(data: Any, train_source: Any, test_source: Any, reader: Reader) -> TaskData:
    train = reader(train_source, data.train_split, key="data.path")
    if test_source is not None:
        test = reader(test_source, data.test_split, key="data.test_path")
        return TaskData(train, test, f"data.test_path {describe_source(test_source)}", len(test))
    if has_split(train_source, data.test_split):
        test = reader(train_source, data.test_split, key="data.path")
        return TaskData(train, test, f"split {data.test_split!r} of {describe_source(train_source)}", len(test))
    held = hold_out(train, data.test_fraction, data.split_seed, describe_source(train_source))
    origin = (f"{len(held.test)} rows of {describe_source(train_source)} held out (data.test_fraction = "
              f"{data.test_fraction}, data.split_seed = {data.split_seed}); they are never trained on")
    return TaskData(held.train, held.test, origin, len(held.test))


def _limited(split: TaskData, eval_limit: int | None) -> TaskData:
    split.test = split.test[:eval_limit]
    return split


def check_batch_fits(train: list[Sample], prompts_per_step: int, origin: str) -> None:
    """Each step takes ``rollout.prompts_per_step`` distinct prompts: the training set must hold that many."""
    if len(train) < prompts_per_step:
        raise DatasetError(f"{origin} has {len(train)} training row(s), fewer than rollout.prompts_per_step = "
                           f"{prompts_per_step}: lower rollout.prompts_per_step or add rows")
