"""Telemetry: metrics writers (JSONL / TensorBoard / W&B), timers, terminal progress, plots.

``plot_run`` is imported lazily so that importing telemetry does not pull in matplotlib.
"""

from __future__ import annotations

from typing import Any

from tandemrl.telemetry.progress import EvalProgress, TrainDisplay, format_step_line, print_summary
from tandemrl.telemetry.timers import StepTimes, Timer, peak_memory_gb, reset_peak_memory
from tandemrl.telemetry.writers import (
    JsonlWriter,
    MetricsWriter,
    MultiWriter,
    TensorBoardWriter,
    WandbWriter,
    make_tensorboard_writer,
    make_writers,
    read_metrics,
)

__all__ = [
    "MetricsWriter",
    "JsonlWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "MultiWriter",
    "make_writers",
    "make_tensorboard_writer",
    "read_metrics",
    "Timer",
    "StepTimes",
    "peak_memory_gb",
    "reset_peak_memory",
    "TrainDisplay",
    "EvalProgress",
    "print_summary",
    "format_step_line",
    "plot_run",
]


def __getattr__(name: str) -> Any:
    if name == "plot_run":
        from tandemrl.telemetry.plot import plot_run

        return plot_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
