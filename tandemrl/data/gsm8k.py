"""The ``gsm8k`` preset: GSM8K rows (``question``, ``answer`` ending in ``#### N``) from any source a user's dataset
can come from (tandemrl/data/sources.py), with the instruction to end on ``#### <number>`` added to each question.

Every row becomes a :class:`~tandemrl.types.Sample` whose ``answer`` is the gold number: the text after the last
``####`` of the row's ``answer`` field, stripped, with thousands separators removed. Problems with the data raise
:class:`DatasetError`, whose message names the file and the line/row (1-based) or the missing key.
"""

from __future__ import annotations

from typing import Any

from tandemrl.data.sources import DatasetError, describe_source, read_rows
from tandemrl.types import Sample

INSTRUCTION = 'Solve the problem step by step. End your answer with a line of the form "#### <number>".'


def gsm8k_prompt(question: str) -> str:
    """The GSM8K prompt text: the question, then the instruction to finish with ``#### <number>``."""
    return f"{question.strip()}\n{INSTRUCTION}"


def gold_from_solution(solution: str, where: str) -> str:
    """The gold answer of a GSM8K solution: text after the last ``####``, stripped, commas removed."""
    if "####" not in solution:
        raise DatasetError(f"{where}: the 'answer' field has no '####' marker before the final answer")
    gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise DatasetError(f"{where}: the 'answer' field has nothing after its last '####'")
    return gold


def load_gsm8k(source: Any, split: str, limit: int | None = None, key: str | None = None) -> list[Sample]:
    """Load GSM8K rows as Samples.

    ``source`` is anything :func:`tandemrl.data.sources.read_rows` reads (a folder holding ``{split}.jsonl`` or
    ``{split}.parquet``, one file, a folder saved by ``datasets``, or a hub id such as ``"openai/gsm8k"``, loaded with
    its ``main`` subset). ``limit`` keeps the first ``limit`` rows. ``key``: the config key that gave ``source``.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    rows = read_rows(source, split, subset="main", key=key)
    if not rows:
        raise DatasetError(f"{describe_source(source)}: the dataset is empty (no rows)")
    return [_row_to_sample(row, where, index=i) for i, (where, row) in enumerate(rows[:limit])]


def _row_to_sample(row: dict[str, Any], where: str, index: int) -> Sample:
    for key in ("question", "answer"):
        if key not in row:
            raise DatasetError(f"{where}: row has no {key!r} key (it has: {', '.join(map(str, row)) or 'none'})")
        if not isinstance(row[key], str) or not row[key].strip():
            raise DatasetError(f"{where}: {key!r} must be a non-empty string, got {row[key]!r}")
    gold = gold_from_solution(row["answer"], where)
    return Sample(
        prompt=gsm8k_prompt(row["question"]),
        answer=gold,
        index=index,
        columns={"question": row["question"], "solution": row["answer"]},
        source=where,
    )
