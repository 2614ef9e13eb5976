"""Rows of a dataset, wherever it lives: a .jsonl / .json / .parquet / .csv file, a folder of such files or one
saved by ``datasets``, a hub dataset id, a list of dicts or a ``datasets.Dataset``.

Every row comes with where it came from (``"train.jsonl, line 12"``), so that a later problem with it names the file
and the row. Problems with the source itself raise :class:`DatasetError`, naming the config key it came from.

A relative path starts from the working directory (not from the config file's folder). A path that does not exist is
read as a hub dataset id only when it looks like one: a name with a file suffix (``train.jsonll``) or a folder part
that exists here (``data/trian``) is a missing local file, and the error lists the closest names beside it.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tandemrl.extras import MissingExtraError

FILE_TYPES = (".jsonl", ".json", ".parquet", ".csv")
# Suffixes of files this module does not read: a missing `train.txt` was meant as a file, not as a hub id.
_OTHER_FILE_SUFFIXES = (".txt", ".tsv", ".arrow", ".gz", ".zip", ".xlsx", ".yaml", ".yml", ".toml")
# A hub dataset id: "name" or "owner/name", nothing that looks like a filesystem path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# What `datasets.Dataset.save_to_disk` / `DatasetDict.save_to_disk` leave in their folder.
_SAVED_BY_DATASETS = ("dataset_info.json", "state.json", "dataset_dict.json")

Row = tuple[str, dict[str, Any]]  # (where it came from, the row)


class DatasetError(ValueError):
    """A problem with a dataset, phrased for the user: names the file and the row (1-based) or the key."""


def read_rows(source: Any, split: str, subset: str | None = None, key: str | None = None) -> list[Row]:
    """All rows of ``source`` for ``split`` (``split`` picks a file in a folder, a split of a saved ``DatasetDict``
    or of a hub dataset; a single file ignores it). ``subset``: a hub dataset's config name. ``key``: the config
    key that gave ``source`` (``data.path``), for the messages."""
    if isinstance(source, (str, os.PathLike)):
        return list(_rows_of_path(str(source), split, subset, key))
    if isinstance(source, list):
        return [(f"row {i}", _as_dict(row, f"row {i}")) for i, row in enumerate(source, start=1)]
    if hasattr(source, "column_names") and hasattr(source, "__iter__"):  # a datasets.Dataset
        return [(f"dataset row {i}", dict(row)) for i, row in enumerate(source, start=1)]
    raise DatasetError(f"a dataset is a path, a hub id, a list of dicts or a datasets.Dataset; got "
                       f"{type(source).__name__}")


def describe_source(source: Any) -> str:
    """How messages name ``source``."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"an in-memory {type(source).__name__} of {len(source)} rows"


def is_local(source: Any) -> bool:
    return not isinstance(source, (str, os.PathLike)) or Path(os.path.expanduser(str(source))).exists()


def has_split(source: Any, split: str) -> bool:
    """Whether a folder or hub dataset has ``split`` (a single file or an in-memory dataset has none)."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    path = Path(os.path.expanduser(str(source)))
    if path.is_file():
        return False
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            return split in json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        return any((path / f"{split}{ext}").is_file() for ext in FILE_TYPES) or any(path.glob(f"{split}-*.parquet"))
    datasets = _import_datasets(f"loading the hub dataset {source!r}")
    try:
        return split in datasets.get_dataset_split_names(str(source))
    except Exception as err:  # noqa: BLE001 - the hub client raises many types; the message is what matters
        raise DatasetError(f"could not read the splits of hub dataset {source!r}: {err}") from err


def looks_local(source: str) -> bool:
    """Whether ``source``, which does not exist, was meant as a local file or folder rather than a hub id: it is no
    hub id (``./x``, ``/x``, ``a/b/c``), has a file suffix (one read here, a near miss such as ``.jsonll``, or another
    file type) or starts with a folder that exists here (``data/trian``)."""
    if not _HUB_ID.match(source):
        return True
    suffix = Path(source).suffix.lower()
    if suffix in FILE_TYPES + _OTHER_FILE_SUFFIXES or difflib.get_close_matches(suffix, FILE_TYPES, n=1, cutoff=0.6):
        return True
    folder, sep, _ = source.partition("/")
    return bool(sep) and Path(folder).is_dir()


def missing_path(source: str) -> str:
    """Where ``source`` was looked for, from what a relative path starts, and the closest names in its folder."""
    given = Path(os.path.expanduser(source))
    text = str(Path(os.path.abspath(given)))
    if not given.is_absolute():
        text += f" (a relative path starts from the working directory, {os.getcwd()}, not from the config file)"
    folder = given.parent
    if not folder.is_dir():
        return f"{text}; the folder {os.path.abspath(folder)} does not exist either"
    close = difflib.get_close_matches(given.name, sorted(os.listdir(folder)), n=3, cutoff=0.6)
    if not close:
        return text
    return f"{text}; did you mean {' or '.join(repr(str(folder / name)) for name in close)}?"


def _named(source: str, key: str | None) -> str:
    """How a message opens: the key and its value, or the value alone when no key gave it."""
    return f"{key} = {source!r}" if key else repr(source)


def _rows_of_path(source: str, split: str, subset: str | None, key: str | None) -> Iterator[Row]:
    path = Path(os.path.expanduser(source))
    if path.is_dir():
        if any((path / name).is_file() for name in _SAVED_BY_DATASETS):
            yield from _saved_dataset_rows(path, split)
            return
        path = _file_in_dir(path, split, _named(source, key))
    elif not path.exists():
        if looks_local(source):
            raise DatasetError(f"{_named(source, key)}: no such file or directory: {missing_path(source)}")
        yield from _hub_rows(source, split, subset, key)
        return
    readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows, ".csv": _csv_rows}
    reader = readers.get(path.suffix)
    if reader is None:
        raise DatasetError(f"{path}: unsupported file type {path.suffix!r} (expected {', '.join(FILE_TYPES)})")
    yield from reader(path)


def _file_in_dir(directory: Path, split: str, named: str) -> Path:
    for ext in FILE_TYPES:
        if (directory / f"{split}{ext}").is_file():
            return directory / f"{split}{ext}"
    shards = sorted(directory.glob(f"{split}-*.parquet"))
    if len(shards) == 1:
        return shards[0]
    if len(shards) > 1:
        raise DatasetError(f"{directory}: several parquet shards for split {split!r}; merge them or pass one file")
    raise DatasetError(f"{named}: no such file: {directory / (split + '.jsonl')} (expected {split}.jsonl, .json, "
                       f".parquet or .csv in {directory}, or a folder saved by datasets)")


def _as_dict(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object with named columns, got {type(row).__name__}")
    return row


def _decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line; a byte that is not UTF-8 names its line."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DatasetError(f"{path}, line {lineno}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column "
                                   f"{err.start + 1}); save the file as UTF-8") from None


def _jsonl_rows(path: Path) -> Iterator[Row]:
    for lineno, line in _decoded_lines(path):
        if not line.strip():
            continue
        where = f"{path}, line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None
        yield where, _as_dict(row, where)


def _json_rows(path: Path) -> Iterator[Row]:
    """A JSON array of objects, or (as many .json files are) one object per line."""
    text = "".join(line for _, line in _decoded_lines(path))
    if not text.lstrip().startswith("["):
        yield from _jsonl_rows(path)
        return
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}, line {err.lineno}: malformed JSON ({err.msg} at column {err.colno})") from None
    for i, row in enumerate(rows, start=1):
        yield f"{path}, item {i}", _as_dict(row, f"{path}, item {i}")


def _csv_rows(path: Path) -> Iterator[Row]:
    text = "".join(line for _, line in _decoded_lines(path))
    try:
        records = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as err:
        raise DatasetError(f"{path}: malformed CSV: {err}") from None
    for i, row in enumerate(records, start=2):  # line 1 is the header
        if None in row:
            raise DatasetError(f"{path}, line {i}: more fields than the header has columns")
        yield f"{path}, line {i}", dict(row)


def _parquet_rows(path: Path) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs pyarrow: pip install 'tandemrl[data]' (or convert the "
                           "file to .jsonl)") from None
    try:
        records = pq.read_table(path).to_pylist()
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for unreadable files
        raise DatasetError(f"{path}: cannot read parquet: {err}") from None
    for i, row in enumerate(records, start=1):
        yield f"{path}, row {i}", row


def _saved_dataset_rows(path: Path, split: str) -> Iterator[Row]:
    datasets = _import_datasets(f"reading {path} (a folder saved by datasets)")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001
        raise DatasetError(f"{path}: cannot load a dataset saved by datasets: {err}") from err
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DatasetError(f"{path} has no split {split!r}; its splits: {', '.join(loaded)}")
        loaded = loaded[split]
    yield from _enumerated(loaded, f"{path} ({split})")


def _hub_rows(name: str, split: str, subset: str | None, key: str | None) -> Iterator[Row]:
    # Said in both errors: the user may have meant a local file, and a hub failure alone would hide that.
    not_local = f"there is no local file or folder {missing_path(name)}"
    datasets = _import_datasets(f"{_named(name, key)}: {not_local}; loading it as a hub dataset")
    try:
        dataset = datasets.load_dataset(name, subset, split=split)
    except Exception as err:  # noqa: BLE001
        raise DatasetError(f"{_named(name, key)}: could not load hub dataset {name!r} (subset {subset!r}, split "
                           f"{split!r}): {err}; and {not_local}") from err
    yield from _enumerated(dataset, f"hub dataset {name!r} split {split!r}")


def _import_datasets(why: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise MissingExtraError(f"{why} needs the datasets package: pip install 'tandemrl[data]'; or give a local "
                                "path (a .jsonl / .json / .parquet / .csv file or a folder of them)") from None
    return datasets


def _enumerated(rows: Iterable[Any], label: str) -> Iterator[Row]:
    for i, row in enumerate(rows, start=1):
        yield f"{label}, row {i}", dict(row)
