"""GSM8K loading: a local directory, a local .jsonl/.parquet file, or the hub dataset (``datasets`` optional).

Every row becomes a :class:`~tandemrl.types.Sample` whose ``answer`` is the gold number: the text after the last
``####`` of the row's ``answer`` field, stripped, with thousands separators removed. Problems with the data raise
:class:`DatasetError`, whose message names the file and the line/row (1-based) or the missing key.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tandemrl.types import Sample

INSTRUCTION = 'Solve the problem step by step. End your answer with a line of the form "#### <number>".'

# A hub dataset id: "name" or "owner/name", nothing that looks like a filesystem path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class DatasetError(ValueError):
    """A problem with a dataset, phrased for the user: names the file and the row (1-based) or the key."""


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


def load_gsm8k(source: str, split: str, limit: int | None = None) -> list[Sample]:
    """Load GSM8K rows as Samples.

    ``source`` is a directory holding ``{split}.jsonl`` or ``{split}.parquet`` (or Hugging Face's
    ``{split}-00000-of-00001.parquet`` layout), a single ``.jsonl``/``.parquet`` file (``split`` is then only
    used in messages), or otherwise a hub dataset name such as ``"openai/gsm8k"`` (config ``"main"``), loaded
    with ``datasets.load_dataset``. ``limit`` keeps the first ``limit`` rows.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    path = Path(os.path.expanduser(source))
    if path.is_dir():
        path = _file_in_dir(path, split)
    elif not path.exists() and (path.suffix in (".jsonl", ".parquet", ".json") or not _HUB_ID.match(source)):
        raise DatasetError(f"no such file or directory: {source}")
    if path.exists():
        label = str(path)
        if path.suffix == ".parquet":
            rows: Iterable[tuple[str, dict[str, Any]]] = _parquet_rows(path)
        elif path.suffix in (".jsonl", ".json"):
            rows = _jsonl_rows(path)
        else:
            raise DatasetError(f"{path}: unsupported file type {path.suffix!r} (expected .jsonl or .parquet)")
    else:
        label = f"hub dataset {source!r} (split {split!r})"
        rows = _hub_rows(source, split)
    samples = []
    for where, row in rows:
        if limit is not None and len(samples) >= limit:
            break
        samples.append(_row_to_sample(row, where, index=len(samples)))
    if not samples:
        raise DatasetError(f"{label}: the dataset is empty (no rows)")
    return samples


def _file_in_dir(directory: Path, split: str) -> Path:
    for name in (f"{split}.jsonl", f"{split}.parquet"):
        if (directory / name).is_file():
            return directory / name
    shards = sorted(directory.glob(f"{split}-*.parquet"))
    if len(shards) == 1:
        return shards[0]
    if len(shards) > 1:
        raise DatasetError(f"{directory}: several parquet shards for split {split!r}; merge them or pass one file")
    raise DatasetError(
        f"no such file: {directory / (split + '.jsonl')} "
        f"(expected {split}.jsonl or {split}.parquet in {directory})"
    )


def _row_to_sample(row: Any, where: str, index: int) -> Sample:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object with 'question' and 'answer', got {type(row).__name__}")
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
    )


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None
            yield where, row


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    if pq is not None:
        try:
            records = pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several types for unreadable files
            raise DatasetError(f"{path}: cannot read parquet: {err}") from None
    else:
        try:
            import pandas as pd
        except ImportError:
            raise DatasetError(
                f"{path}: reading parquet needs pyarrow (pip install pyarrow) or pandas; "
                "or convert the file to .jsonl"
            ) from None
        try:
            records = pd.read_parquet(path).to_dict(orient="records")
        except Exception as err:
            raise DatasetError(f"{path}: cannot read parquet: {err}") from None
    for i, row in enumerate(records, start=1):
        yield f"{path}, row {i}", row


def _hub_rows(name: str, split: str) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"{name!r} is not a local file or directory, and loading it from the hub needs the 'datasets' "
            "package: pip install datasets, "
            "or give a local path (a directory with train.jsonl/test.jsonl, or a .jsonl/.parquet file)"
        ) from None
    try:
        dataset = datasets.load_dataset(name, "main", split=split)
    except Exception as err:
        raise DatasetError(f"could not load hub dataset {name!r} (config 'main', split {split!r}): {err}") from err
    for i, row in enumerate(dataset, start=1):
        yield f"hub dataset {name!r} split {split!r}, row {i}", dict(row)
