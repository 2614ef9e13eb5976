"""A user's own dataset as Samples: TRL's formats, the prompt column configurable, every other column kept.

``prompt`` is either text (the model continues it as it is, or inside the chat template when
``data.use_chat_template`` is set) or a list of chat messages ``[{"role": "user", "content": "..."}]``, rendered
with the tokenizer's chat template. Every other column reaches the reward functions by name; nothing is added to
the prompt. The columns are the dataset's, fixed at load: every key of any row, None in a row that lacks it (as
``datasets`` gives them to TRL), so that every batch passes the reward functions the same keywords.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tandemrl.data.sources import DatasetError, Row
from tandemrl.types import Sample

RESERVED_COLUMNS = ("prompts", "completions", "completion_ids")  # the reward functions' own arguments


def rows_to_samples(rows: list[Row], prompt_column: str, label: str) -> list[Sample]:
    """One Sample per row; the first bad row stops with its place and what is wrong."""
    if not rows:
        raise DatasetError(f"{label}: the dataset is empty (no rows)")
    keys = dataset_columns(rows, prompt_column)
    samples = []
    for index, (where, row) in enumerate(rows):
        if prompt_column not in row:
            have = ", ".join(map(str, row)) or "none"
            raise DatasetError(f"{where}: no {prompt_column!r} column (data.prompt_column); the columns are: {have}")
        reserved = [c for c in RESERVED_COLUMNS if c in row]
        if reserved:
            raise DatasetError(f"{where}: column {reserved[0]!r} has the name of a reward function argument; "
                               "rename it")
        columns = {key: row.get(key) for key in keys}
        samples.append(Sample(prompt=check_prompt(row[prompt_column], where, prompt_column), answer=None,
                              index=index, columns=columns, source=where))
    return samples


def dataset_columns(rows: list[Row], prompt_column: str) -> list[str]:
    """The dataset's reward columns: every key of any row but the prompt, in first-seen order. A key only some rows
    have is still a column (None elsewhere): otherwise a reward's keyword would come and go between batches."""
    keys: dict[str, None] = {}
    for _, row in rows:
        keys.update(dict.fromkeys(row))
    keys.pop(prompt_column, None)
    return list(keys)


def check_prompt(prompt: Any, where: str, column: str) -> str | list[dict[str, Any]]:
    """A non-empty string, or a non-empty list of ``{"role": str, "content": str}`` messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DatasetError(f"{where}: {column!r} is empty")
        return prompt
    if isinstance(prompt, list) and prompt:
        for i, message in enumerate(prompt):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise DatasetError(f"{where}: {column!r} message {i} must be an object with string 'role' and "
                                   f"'content', got {message!r:.120}")
        return prompt
    raise DatasetError(f"{where}: {column!r} must be a string or a list of chat messages "
                       f"([{{'role': 'user', 'content': '...'}}]), got {type(prompt).__name__}")


@dataclass
class HeldOut:
    train: list[Sample]
    test: list[Sample]


def hold_out(samples: list[Sample], fraction: float, seed: int, label: str) -> HeldOut:
    """A seeded ``fraction`` of ``samples`` (at least one) as the test set; the rest, in order, for training."""
    if len(samples) < 2:
        raise DatasetError(f"{label} has {len(samples)} row: too few to hold out a test set; give data.test_path")
    n_test = min(len(samples) - 1, max(1, round(len(samples) * fraction)))
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    test_ids = set(order[:n_test])
    train = [s for i, s in enumerate(samples) if i not in test_ids]
    test = [s for i, s in enumerate(samples) if i in test_ids]
    return HeldOut(train=_reindexed(train), test=_reindexed(test))


def _reindexed(samples: list[Sample]) -> list[Sample]:
    """Sample.index is the position in its split (the curriculum and samples.jsonl key on it)."""
    for i, s in enumerate(samples):
        s.index = i
    return samples
