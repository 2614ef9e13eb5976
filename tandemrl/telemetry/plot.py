"""Plots of a run's metrics.jsonl (PNG, matplotlib Agg via Figure + FigureCanvasAgg; pyplot is not used).

Training series (one value per step, noisy) are drawn raw and faint with a bold moving average beside them;
evaluations are drawn as separate markers, never joined by a line (two evaluations are two measurements, not a
trend between them).

Usage: ``python -m tandemrl.telemetry.plot RUN_DIR``.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tandemrl.telemetry.writers import read_metrics

__all__ = ["plot_run", "load_series", "run_figures", "moving_average"]

Series = tuple[list[float], list[float]]

_COMPONENT = re.compile(r"^reward/(.+)/mean$")
_PASS_AT = re.compile(r"^eval/pass@(\d+)$")


def _finite(v: Any) -> float | None:
    if v is None or isinstance(v, (str, bool)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def load_series(rows: Sequence[dict[str, Any]]) -> dict[str, Series]:
    """``{key: (steps, values)}`` over rows that have a finite value for the key, sorted by step."""
    acc: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        step = _finite(row.get("step"))
        if step is None:
            continue
        for key, value in row.items():
            if key == "step":
                continue
            f = _finite(value)
            if f is not None:
                acc.setdefault(key, []).append((step, f))
    out: dict[str, Series] = {}
    for key, pts in acc.items():
        pts.sort(key=lambda p: p[0])
        out[key] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def _new_figure(title: str, ylabel: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


SMOOTH_MIN_POINTS = 8  # fewer training points than this: the raw curve alone says it all
EVAL_MARKER = {"linestyle": "none", "marker": "s", "markersize": 6}  # evaluations are separate points, not a curve


def smoothing_window(n: int) -> int:
    """Steps per moving-average window: a tenth of the run, at least 2 (0 = do not smooth)."""
    return 0 if n < SMOOTH_MIN_POINTS else max(2, n // 10)


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start), so the curve keeps every step."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _train_curve(ax: Any, s: dict[str, Series], key: str, label: str, **kwargs: Any) -> None:
    """A per-step training series: the raw values thin and faint, their moving average bold beside them."""
    if key not in s:
        return
    steps, vals = s[key]
    window = smoothing_window(len(steps))
    small = {"marker": "o", "markersize": 3} if len(steps) <= 30 else {}
    (raw,) = ax.plot(steps, vals, label=f"{label} (raw)" if window else label, linewidth=1,
                     alpha=0.35 if window else 0.9, **small, **kwargs)
    if window:
        ax.plot(steps, moving_average(vals, window), label=f"{label} (mean of {window} steps)", linewidth=2,
                color=raw.get_color())


def _eval_points(ax: Any, s: dict[str, Series], key: str, label: str, **kwargs: Any) -> None:
    if key in s:
        ax.plot(*s[key], label=label, **{**EVAL_MARKER, **kwargs})


def _plot_reward(s: dict[str, Series]) -> Figure | None:
    comps = sorted(k for k in s if _COMPONENT.match(k))
    if "reward/mean" not in s and not comps and "eval/reward" not in s:
        return None
    fig, ax = _new_figure("Reward", "reward")
    if "reward/mean" in s and "reward/std" in s:
        steps, mean = s["reward/mean"]
        std_at = dict(zip(*s["reward/std"], strict=True))
        band = [(x, m, std_at[x]) for x, m in zip(steps, mean, strict=True) if x in std_at]
        if band:
            ax.fill_between([b[0] for b in band], [b[1] - b[2] for b in band], [b[1] + b[2] for b in band],
                            alpha=0.12, color="tab:blue", label="±std")
    _train_curve(ax, s, "reward/mean", "reward", color="tab:blue")
    if len(comps) > 1:  # a single component is the mean itself (times its weight): no second curve
        for i, key in enumerate(comps, start=1):
            _train_curve(ax, s, key, _COMPONENT.match(key).group(1), color=f"C{i}")
    _eval_points(ax, s, "eval/reward", "eval reward", color="black")
    return _finish(fig, ax)


def _plot_accuracy(s: dict[str, Series]) -> Figure | None:
    pass_keys = sorted((k for k in s if _PASS_AT.match(k)), key=lambda k: int(_PASS_AT.match(k).group(1)))
    if "accuracy" not in s and "eval/accuracy" not in s and not pass_keys:
        return None
    fig, ax = _new_figure("Accuracy", "accuracy")
    _train_curve(ax, s, "accuracy", "train accuracy (sampled)")
    _eval_points(ax, s, "eval/accuracy", "eval accuracy (greedy)", color="black")
    for key in pass_keys:
        _eval_points(ax, s, key, key.removeprefix("eval/"), marker="^")
    return _finish(fig, ax)


def _plot_length(s: dict[str, Series]) -> Figure | None:
    if "response_length/mean" not in s and "response_length/max" not in s:
        return None
    fig, ax = _new_figure("Response length", "tokens")
    _train_curve(ax, s, "response_length/mean", "mean")
    _train_curve(ax, s, "response_length/max", "max")
    return _finish(fig, ax)


def _plot_loss(s: dict[str, Series]) -> Figure | None:
    if "loss" not in s and "kl" not in s:
        return None
    fig, ax = _new_figure("Loss and KL", "loss")
    _train_curve(ax, s, "loss", "loss")
    # KL lives on a different scale: its own axis on the right.
    kl_ax = ax.twinx() if "loss" in s and "kl" in s else ax
    if kl_ax is not ax:
        kl_ax.set_ylabel("kl")
    _train_curve(kl_ax, s, "kl", "kl", color="tab:red")
    handles = [h for a in {ax, kl_ax} for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, labels=[h.get_label() for h in handles], loc="best", fontsize="small")
    return fig


def _finish(fig: Figure, ax: Any) -> Figure:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="best", fontsize="small")
    return fig


PLOTS = (("reward.png", _plot_reward), ("accuracy.png", _plot_accuracy),
         ("response_length.png", _plot_length), ("loss.png", _plot_loss))


def run_figures(series: dict[str, Series]) -> dict[str, Figure]:
    """The figures of a run's series by file name; a plot without any of its metrics is left out."""
    figures = {name: fn(series) for name, fn in PLOTS}
    return {name: fig for name, fig in figures.items() if fig is not None}


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write reward / accuracy / response-length / loss PNGs into ``run_dir/plots``; return their paths.

    A plot is skipped when the run has none of its metrics. Raises FileNotFoundError when
    ``run_dir/metrics.jsonl`` is missing and ValueError when it has no rows.
    """
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file to plot: {path} does not exist")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"no metrics to plot: {path} is empty (no JSON rows)")
    series = load_series(rows)
    if not series:
        raise ValueError(f"no metrics to plot: {path} has {len(rows)} rows but no finite values with a step")
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, fig in run_figures(series).items():
        fig.savefig(out_dir / name)
        written.append(out_dir / name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tandemrl.telemetry.plot RUN_DIR", file=sys.stderr)
        return 2
    try:
        paths = plot_run(args[0])
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
