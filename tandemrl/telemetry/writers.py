"""Metrics sinks: JSONL (always), TensorBoard and Weights & Biases (optional).

Every writer takes one flat ``dict[str, float]`` per call, keyed by the names in the
project's metrics list (``reward/mean``, ``loss``, ``eval/accuracy`` ...).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tandemrl.extras import installed, require_extra

__all__ = [
    "MetricsWriter",
    "JsonlWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "MultiWriter",
    "make_writers",
    "make_tensorboard_writer",
    "tensorboard_available",
    "read_metrics",
    "to_scalar",
]


@runtime_checkable
class MetricsWriter(Protocol):
    """Anything that accepts one metrics dict per step."""

    def write(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def to_scalar(key: str, value: Any) -> int | float | None:
    """Coerce one metric value to a JSON-friendly number.

    ints (and bools) stay ints, everything numeric becomes a float (0-d tensors and numpy
    scalars included), ``None`` and non-finite floats become ``None``.
    """
    if value is None:
        return None
    if type(value) is int:  # the common cases first: the ABC checks below cost ~3 us a value (samples.jsonl)
        return value
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    item = getattr(value, "item", None)  # torch tensors / numpy arrays with one element
    if callable(item):
        try:
            return to_scalar(key, item())
        except (ValueError, RuntimeError) as exc:
            raise TypeError(f"metric {key!r} is not a scalar: {value!r}") from exc
    raise TypeError(f"metric {key!r} has non-numeric value {value!r} ({type(value).__name__})")


def _clean(step: int, metrics: Mapping[str, Any], keep_text: bool = False) -> dict[str, int | float | str | None]:
    """``keep_text``: strings pass through (JSONL rows carry texts; TensorBoard and W&B take scalars only)."""
    row: dict[str, int | float | str | None] = {"step": int(step)}
    for key, value in metrics.items():
        if key == "step":
            continue
        row[str(key)] = value if keep_text and isinstance(value, str) else to_scalar(key, value)
    return row


def write_error(path: Path, exc: OSError) -> OSError:
    """An OSError naming `path` and, for ENOSPC, saying the disk is full (the raw one often names no file)."""
    reason = "the disk is full (no space left on device)" if exc.errno == errno.ENOSPC else str(exc)
    return OSError(exc.errno, f"cannot write metrics to {path}: {reason}")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a metrics.jsonl file. Blank and unparsable lines (a torn last line after a crash) are skipped."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    return rows


class JsonlWriter:
    """Append one JSON object per :meth:`write` to ``path``, flushing every line.

    Opening an existing file appends to it (resume). Call :meth:`truncate_after` with the
    step a run resumes from so rows written after that checkpoint are not duplicated.
    Non-finite values are written as ``null``. ``text``: string values are written too (samples.jsonl's prompts
    and completions); otherwise a string is an error (a metric must be a number).
    """

    def __init__(self, path: str | os.PathLike[str], text: bool = False) -> None:
        self.path = Path(path)
        self.text = text
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self._open()
        self._failed: OSError | None = None  # a write that failed: raised again, never retried half-way

    def _open(self):
        fh = open(self.path, "a+", encoding="utf-8")
        # If a crash left a torn last line, start on a fresh line so the next row stays parseable.
        if fh.tell() > 0:
            fh.seek(fh.tell() - 1)
            if fh.read(1) != "\n":
                fh.write("\n")
                fh.flush()
        return fh

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.write_many(step, [metrics])

    def write_many(self, step: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """Several rows of one step (e.g. one per sample) in one write and one flush."""
        if self._failed is not None:
            raise self._failed
        if self._fh is None:
            raise RuntimeError(f"JsonlWriter({self.path}) is closed")
        text = "".join(json.dumps(_clean(step, row, keep_text=self.text), allow_nan=False) + "\n" for row in rows)
        try:
            self._fh.write(text)
            self._fh.flush()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        # drop the file quietly, so its unflushed buffer cannot fail again later as a stray "Exception ignored"
        with contextlib.suppress(OSError):
            self._fh.close()
        self._fh = None
        self._failed = write_error(self.path, exc)
        raise self._failed from exc

    def truncate_after(self, step: int) -> int:
        """Drop rows whose step is > ``step`` (and unparsable lines). Returns the number of rows dropped."""
        if self._fh is not None:
            self._fh.flush()
            self._fh.close()
            self._fh = None
        try:
            kept: list[str] = []
            dropped = 0
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    stripped = line.strip()
                    if not stripped:
                        continue
                    try:
                        obj = json.loads(stripped)
                        row_step = obj.get("step") if isinstance(obj, dict) else None
                    except json.JSONDecodeError:
                        dropped += 1
                        continue
                    if isinstance(row_step, (int, float)) and row_step > step:
                        dropped += 1
                        continue
                    kept.append(stripped + "\n")
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(kept)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        finally:
            self._fh = self._open()
        return dropped

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                self._fail(exc)
            self._fh = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tensorboard_available() -> bool:
    return installed("tensorboard")


class TensorBoardWriter:
    """Scalars to TensorBoard through ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        if not tensorboard_available():
            require_extra("tensorboard", "tensorboard", "TensorBoard logging was asked for")
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(logdir)
        self._writer = SummaryWriter(log_dir=str(self.logdir))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        # the event file is written by a background thread; its error comes back here, on the next call
        try:
            for key, value in _clean(step, metrics).items():
                if key == "step" or value is None:
                    continue
                self._writer.add_scalar(key, value, global_step=int(step))
            self._writer.flush()
        except OSError as exc:
            raise write_error(self.logdir, exc) from exc

    def close(self) -> None:
        try:
            self._writer.close()
        except OSError as exc:
            raise write_error(self.logdir, exc) from exc


def make_tensorboard_writer(logdir: str | os.PathLike[str]) -> TensorBoardWriter | None:
    """A :class:`TensorBoardWriter`, or ``None`` when tensorboard is not installed."""
    if not tensorboard_available():
        return None
    return TensorBoardWriter(logdir)


class WandbWriter:
    """Weights & Biases logging; ``wandb`` is imported only when this is constructed."""

    def __init__(self, project: str, run_name: str | None, config: Mapping[str, Any] | None = None, **init_kwargs: Any) -> None:
        require_extra("wandb", "wandb", f"log.wandb_project = {project!r} is set")
        import wandb  # type: ignore[import-not-found]

        self._wandb = wandb
        self._run = wandb.init(project=project, name=run_name, config=dict(config or {}), **init_kwargs)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        row = {k: v for k, v in _clean(step, metrics).items() if k != "step" and v is not None}
        self._run.log(row, step=int(step))

    def close(self) -> None:
        self._run.finish()


class MultiWriter:
    """Fans each call out to several writers. ``close`` closes all of them even if one fails."""

    def __init__(self, writers: Iterable[MetricsWriter | None]) -> None:
        self.writers: list[MetricsWriter] = [w for w in writers if w is not None]

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for w in self.writers:
            w.write(step, metrics)

    def truncate_after(self, step: int) -> None:
        """Forward to every writer that supports it (the JSONL file); others are left alone."""
        for w in self.writers:
            fn = getattr(w, "truncate_after", None)
            if callable(fn):
                fn(step)

    def close(self) -> None:
        errors: list[BaseException] = []
        for w in self.writers:
            try:
                w.close()
            except Exception as exc:  # noqa: BLE001 - close the rest, re-raise the first
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> MultiWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.writers)


def make_writers(
    out_dir: str | os.PathLike[str],
    tensorboard: bool | None,
    wandb_project: str | None,
    config: Mapping[str, Any] | None,
) -> MultiWriter:
    """JSONL at ``out_dir/metrics.jsonl``, plus TensorBoard in ``out_dir/tb`` and W&B when asked.

    ``tensorboard``: True, False, or None for "when installed". A package that is asked for and missing raises
    :class:`tandemrl.extras.MissingExtraError` before anything is written (a run checks this earlier, with
    :func:`tandemrl.extras.check_run_extras`, and says when None finds no tensorboard).
    """
    if tensorboard:
        require_extra("tensorboard", "tensorboard", "log.tensorboard = true")
    if wandb_project:
        require_extra("wandb", "wandb", f"log.wandb_project = {wandb_project!r} is set")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    writers: list[MetricsWriter] = [JsonlWriter(out / "metrics.jsonl")]
    try:
        if tensorboard or tensorboard is None and tensorboard_available():
            writers.append(TensorBoardWriter(out / "tb"))
        if wandb_project:
            cfg = dict(config or {})
            run_name = cfg.get("run_name") or cfg.get("name") or out.name
            writers.append(WandbWriter(wandb_project, str(run_name), cfg))
    except BaseException:
        MultiWriter(writers).close()
        raise
    return MultiWriter(writers)
