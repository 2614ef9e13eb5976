"""Task dispatch by name ("gsm8k", "synthetic:<task>"), prompt formatting and reward columns."""

from __future__ import annotations

from typing import Any

from tandemrl.data.gsm8k import load_gsm8k
from tandemrl.data.synthetic import SYNTHETIC_TASKS, make_synthetic
from tandemrl.types import Sample

GSM8K_HUB_NAME = "openai/gsm8k"
SYNTHETIC_TRAIN_SIZE = 2000
SYNTHETIC_TEST_SIZE = 500
TASK_NAMES: tuple[str, ...] = ("gsm8k",) + tuple(f"synthetic:{t}" for t in SYNTHETIC_TASKS)
SPLITS = ("train", "test")


def load_task(
    name: str, split: str, *, path: str | None = None, limit: int | None = None, seed: int = 0
) -> list[Sample]:
    """Samples of task ``name`` for ``split``.

    - ``"gsm8k"``: from ``path`` (a local directory or .jsonl/.parquet file) or, when ``path`` is None, from the
      hub dataset ``openai/gsm8k`` (needs the ``datasets`` package and network access). ``seed`` is unused.
    - ``"synthetic:<task>"``: generated; ``limit`` samples (default 2,000 for train, 500 for test). The test
      split comes from a different random stream than train, with the same ``seed`` (answer spaces are tiny,
      so prompts overlap between splits). ``path`` must be None.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if name == "gsm8k":
        return load_gsm8k(path if path is not None else GSM8K_HUB_NAME, split, limit)
    if name.startswith("synthetic:") and name.split(":", 1)[1] in SYNTHETIC_TASKS:
        if path is not None:
            raise ValueError(f"task {name!r} is generated and takes no data path (got path={path!r})")
        if split not in SPLITS:
            raise ValueError(f"task {name!r} has splits {', '.join(SPLITS)}; got {split!r}")
        default = SYNTHETIC_TRAIN_SIZE if split == "train" else SYNTHETIC_TEST_SIZE
        return make_synthetic(name.split(":", 1)[1], limit or default, seed, split=split)
    raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")


def format_prompt(sample: Sample, tokenizer: Any, use_chat_template: bool, system_prompt: str | None = None) -> str:
    """The text to generate from.

    With ``use_chat_template`` the prompt becomes a user message (after an optional system message) rendered by
    ``tokenizer.apply_chat_template(..., tokenize=False, add_generation_prompt=True)``. Without it the raw
    ``sample.prompt`` is returned unchanged (``system_prompt`` is then not used).
    """
    if not use_chat_template:
        return sample.prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "use_chat_template is set but the tokenizer has no chat template; "
            "set data.use_chat_template = false or use an instruct model's tokenizer"
        )
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": sample.prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def reward_columns(samples: list[Sample]) -> dict[str, list[Any]]:
    """Columns for reward functions, aligned with ``samples``: ``answer`` plus every key of ``Sample.columns``
    (None where a sample lacks a key). Repeat each sample ``group_size`` times before calling for grouped
    rollouts."""
    keys: dict[str, None] = {}
    for s in samples:
        keys.update(dict.fromkeys(s.columns))
    keys.pop("answer", None)
    columns: dict[str, list[Any]] = {"answer": [s.answer for s in samples]}
    for key in keys:
        columns[key] = [s.columns.get(key) for s in samples]
    return columns
