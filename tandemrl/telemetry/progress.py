"""Terminal display for training and evaluation (rich).

Works on a TTY (live bar, per-step lines printed above it) and in CI logs (no live bar;
the per-step lines are still printed, one per step).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from tandemrl.telemetry.completions import CompletionExample, completions_table

__all__ = ["TrainDisplay", "EvalProgress", "print_summary", "format_step_line", "fmt_num"]

_COMPONENT = re.compile(r"^reward/(.+)/mean$")


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f


def fmt_num(value: Any, digits: int = 3) -> str:
    """Compact number: 3 significant digits, exponent for very small/large, ``nan`` for missing."""
    f = _num(value)
    if f is None or math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if f == 0:
        return "0"
    if f == int(f) and abs(f) < 1e6:
        return str(int(f))
    if abs(f) < 1e-3 or abs(f) >= 1e6:
        return f"{f:.{max(digits - 1, 1)}e}"
    return f"{f:.{digits}g}"


def _fmt_rate(value: Any) -> str:
    f = _num(value)
    if f is None or not math.isfinite(f):
        return "nan"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(f) >= scale:
            return f"{f / scale:.3g}{unit}"
    return f"{f:.3g}"


def _fmt_secs(value: Any) -> str:
    f = _num(value)
    if f is None or not math.isfinite(f):
        return "nan"
    if f >= 3600:
        return f"{f / 3600:.1f}h"
    if f >= 60:
        return f"{f / 60:.1f}m"
    if f >= 10:
        return f"{f:.1f}s"
    return f"{f:.2f}s"


def format_step_line(step: int, metrics: Mapping[str, Any], total_steps: int | None = None) -> Text:
    """One compact line: step, reward mean±std (components), accuracy, loss, kl, clip, entropy, tool calls and errors,
    length, speed, memory."""
    line = Text()
    sep = Text(" | ", style="dim")
    parts: list[Text] = []

    head = f"step {step}" + (f"/{total_steps}" if total_steps else "")
    parts.append(Text(head, style="bold"))

    if "reward/mean" in metrics:
        reward = Text("reward ")
        reward.append(fmt_num(metrics["reward/mean"]), style="bold green")
        if "reward/std" in metrics:
            reward.append("±" + fmt_num(metrics["reward/std"]))
        comps = []
        for key in metrics:
            m = _COMPONENT.match(key)
            if m:
                comps.append(f"{m.group(1)} {fmt_num(metrics[key])}")
        if comps:
            reward.append(" (" + ", ".join(comps) + ")", style="dim")
        parts.append(reward)
    else:
        comps = [f"{m.group(1)} {fmt_num(metrics[k])}" for k in metrics if (m := _COMPONENT.match(k))]
        if comps:
            parts.append(Text("reward (" + ", ".join(comps) + ")"))

    errors = _num(metrics.get("reward/errors"))
    if errors:
        parts.append(Text(f"reward errors {fmt_num(errors)}", style="bold red"))

    for key, label in (
        ("accuracy", "acc"),
        ("loss", "loss"),
        ("kl", "kl"),
        ("clip_frac", "clip"),
        ("entropy", "ent"),
        ("tools/calls_per_traj", "calls"),  # multi-turn rollouts: tool calls and failed calls per trajectory
        ("tools/errors", "tool err"),
    ):
        if key in metrics:
            parts.append(Text(f"{label} {fmt_num(metrics[key])}"))

    if "response_length/mean" in metrics:
        parts.append(Text(f"len {fmt_num(metrics['response_length/mean'])}"))
    if "tokens_per_s" in metrics:
        parts.append(Text(f"{_fmt_rate(metrics['tokens_per_s'])} tok/s"))
    if "time/step" in metrics:
        parts.append(Text(_fmt_secs(metrics["time/step"])))
    if "memory/peak_gb" in metrics:
        mem = _num(metrics["memory/peak_gb"])
        parts.append(Text(f"mem {mem:.1f}G" if mem is not None and math.isfinite(mem) else "mem nan"))

    skipped = _num(metrics.get("skipped_nonfinite"))
    if skipped:
        parts.append(Text("skipped (non-finite)", style="bold red"))

    for i, part in enumerate(parts):
        if i:
            line.append_text(sep)
        line.append_text(part)
    return line


class TrainDisplay:
    """Progress bar over training steps with one printed line per step.

    ``start_step`` is the number of steps already done (resume); each :meth:`log_step` call
    advances the bar by one step. The ETA is estimated from steps done in this process only.
    """

    def __init__(self, total_steps: int, start_step: int = 0, console: Console | None = None) -> None:
        self.total_steps = int(total_steps)
        self.start_step = int(start_step)
        self.console = console if console is not None else Console()
        self._progress = Progress(
            TextColumn("[bold blue]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> TrainDisplay:
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total_steps, completed=self.start_step)
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def log_step(self, step: int, metrics: Mapping[str, Any], advance: int = 1) -> None:
        self.console.print(format_step_line(step, metrics, self.total_steps), soft_wrap=True)
        if self._task is not None and advance:
            self._progress.advance(self._task, advance)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print a message above the bar."""
        self.console.print(*args, **kwargs)

    def print_completions(self, step: int, examples: list[CompletionExample]) -> None:
        """A table of a few completions above the bar (nothing for none)."""
        if examples:
            self.console.print(completions_table(step, examples))


class EvalProgress:
    """``with EvalProgress(n, "eval") as p: ... p.advance(k)``; transient bar over examples."""

    def __init__(self, total: int, description: str = "eval", console: Console | None = None) -> None:
        self.total = int(total)
        self.description = description
        self.console = console if console is not None else Console()
        self._progress = Progress(
            TextColumn("[bold magenta]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> EvalProgress:
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)


def _split_summary(summary: Mapping[str, Any]) -> tuple[dict[str, tuple[Any, Any]], dict[str, Any]]:
    """Pair initial/final values. Accepts ``{"initial": {...}, "final": {...}}`` and flat keys
    ``initial/<m>`` / ``final/<m>`` / ``initial_<m>`` / ``final_<m>``; anything else is "other"."""
    initial: dict[str, Any] = {}
    final: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for key, value in summary.items():
        if key in ("initial", "final") and isinstance(value, Mapping):
            (initial if key == "initial" else final).update(value)
            continue
        m = re.match(r"^(initial|final)[/_](.+)$", key)
        if m:
            (initial if m.group(1) == "initial" else final)[m.group(2)] = value
        else:
            other[key] = value
    names = list(dict.fromkeys([*initial, *final]))
    return {n: (initial.get(n), final.get(n)) for n in names}, other


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> Table:
    """Render a table of initial vs final metrics (accuracy, reward, ...) and any other scalars."""
    console = console if console is not None else Console()
    pairs, other = _split_summary(summary)
    table = Table(title="Run summary", show_lines=False)
    table.add_column("metric")
    table.add_column("initial", justify="right")
    table.add_column("final", justify="right")
    table.add_column("change", justify="right")
    for name, (a, b) in pairs.items():
        fa, fb = _num(a), _num(b)
        change = ""
        if fa is not None and fb is not None and math.isfinite(fa) and math.isfinite(fb):
            d = fb - fa
            style = "green" if d > 0 else ("red" if d < 0 else "")
            change = Text(("+" if d > 0 else "") + fmt_num(d), style=style)
        table.add_row(
            name,
            "-" if a is None else (fmt_num(a) if fa is not None else str(a)),
            "-" if b is None else (fmt_num(b) if fb is not None else str(b)),
            change,
        )
    for name, value in other.items():
        shown = fmt_num(value) if _num(value) is not None else str(value)
        table.add_row(name, "", shown, "")
    console.print(table)
    return table
