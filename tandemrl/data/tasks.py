"""Task dispatch by name ("gsm8k", "synthetic:<task>"), prompt formatting and reward columns."""

from __future__ import annotations

from typing import Any

from tandemrl.data.arithmetic import make_arith2
from tandemrl.data.gsm8k import load_gsm8k
from tandemrl.data.synthetic import SYNTHETIC_TASKS, make_synthetic
from tandemrl.types import Sample

GSM8K_HUB_NAME = "openai/gsm8k"
SYNTHETIC_TRAIN_SIZE = 2000
SYNTHETIC_TEST_SIZE = 500
TASK_NAMES: tuple[str, ...] = ("gsm8k", "arith2") + tuple(f"synthetic:{t}" for t in SYNTHETIC_TASKS)
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
    - ``"arith2"``: two-digit ``+ - *`` problems for instruct models (tandemrl.data.arithmetic): a fixed held-out
      test set of 1,000 (``limit`` takes a prefix; default all), train = every other problem in a seeded order.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if name == "gsm8k":
        return load_gsm8k(path if path is not None else GSM8K_HUB_NAME, split, limit)
    if name == "arith2":
        if path is not None:
            raise ValueError(f"task {name!r} is generated and takes no data path (got path={path!r})")
        return make_arith2(split, limit, seed)
    if name.startswith("synthetic:") and name.split(":", 1)[1] in SYNTHETIC_TASKS:
        if path is not None:
            raise ValueError(f"task {name!r} is generated and takes no data path (got path={path!r})")
        if split not in SPLITS:
            raise ValueError(f"task {name!r} has splits {', '.join(SPLITS)}; got {split!r}")
        default = SYNTHETIC_TRAIN_SIZE if split == "train" else SYNTHETIC_TEST_SIZE
        return make_synthetic(name.split(":", 1)[1], limit or default, seed, split=split)
    raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")


def format_prompt(sample: Sample, tokenizer: Any, use_chat_template: bool, system_prompt: str | None = None,
                  tools: list[dict[str, Any]] | None = None) -> str:
    """The text to generate from.

    A prompt given as chat messages is always rendered by ``tokenizer.apply_chat_template(..., tokenize=False,
    add_generation_prompt=True)`` (after ``system_prompt`` when the messages have no system message of their own).
    A text prompt is returned unchanged, or with ``use_chat_template`` rendered as one user message the same way.
    ``tools`` (JSON-schema descriptions) go to the chat template, which describes them to the model (Qwen's
    templates do).
    """
    conversational = isinstance(sample.prompt, list)
    if not (use_chat_template or conversational):
        return sample.prompt  # type: ignore[return-value]
    if not getattr(tokenizer, "chat_template", None):
        where = f"{sample.source}: the prompt is a list of chat messages, but" if conversational else \
            "data.use_chat_template is set but"
        raise ValueError(f"{where} the tokenizer has no chat template; use an instruct model's tokenizer"
                         + ("" if conversational else " or set data.use_chat_template = false"))
    messages = list(sample.prompt) if conversational else [{"role": "user", "content": sample.prompt}]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


def reward_columns(samples: list[Sample]) -> dict[str, list[Any]]:
    """Columns for reward functions, aligned with ``samples``: every key of ``Sample.columns`` (None where a sample
    lacks a key), and ``answer`` from ``Sample.answer`` for the built-in tasks. Repeat each sample ``group_size``
    times before calling for grouped rollouts.

    A user's dataset gives every sample every column at load (tandemrl/data/dataset.py), so the keys do not depend
    on which rows a batch holds; the union here covers samples built by hand."""
    keys: dict[str, None] = {}
    for s in samples:
        keys.update(dict.fromkeys(s.columns))
    columns: dict[str, list[Any]] = {}
    if any(s.answer is not None for s in samples):
        keys.pop("answer", None)
        columns["answer"] = [s.answer for s in samples]
    for key in keys:
        columns[key] = [s.columns.get(key) for s in samples]
    return columns
