"""Plots of a run's metrics.jsonl (PNG, matplotlib Agg via Figure + FigureCanvasAgg; pyplot is not used).

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

__all__ = ["plot_run", "load_series"]

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


def _style(steps: list[float]) -> dict[str, Any]:
    # A few points (e.g. eval rows) are easier to read with markers.
    return {"marker": "o", "markersize": 3} if len(steps) <= 30 else {}


def _line(ax: Any, s: dict[str, Series], key: str, train: bool = False, **kwargs: Any) -> None:
    """Plot series `key` if the run logged it; train=True adds the per-step style (markers for short runs)."""
    if key in s:
        steps, vals = s[key]
        ax.plot(steps, vals, **kwargs, **(_style(steps) if train else {}))


def _save(fig: Figure, ax: Any, path: Path) -> Path:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="best", fontsize="small")
    fig.savefig(path)
    return path


def _plot_reward(s: dict[str, Series], path: Path) -> Path | None:
    comps = sorted(k for k in s if _COMPONENT.match(k))
    if "reward/mean" not in s and not comps and "eval/reward" not in s:
        return None
    fig, ax = _new_figure("Reward", "reward")
    if "reward/mean" in s:
        steps, mean = s["reward/mean"]
        (line,) = ax.plot(steps, mean, label="reward (mean)", linewidth=2, **_style(steps))
        if "reward/std" in s:
            std_at = dict(zip(*s["reward/std"], strict=True))
            band = [(x, m, std_at[x]) for x, m in zip(steps, mean, strict=True) if x in std_at]
            if band:
                xs = [b[0] for b in band]
                ax.fill_between(
                    xs,
                    [b[1] - b[2] for b in band],
                    [b[1] + b[2] for b in band],
                    alpha=0.2,
                    color=line.get_color(),
                    label="±std",
                )
    for key in comps:
        _line(ax, s, key, label=_COMPONENT.match(key).group(1), linewidth=1, alpha=0.85, train=True)
    _line(ax, s, "eval/reward", label="eval reward", linestyle="--", marker="s", markersize=4)
    return _save(fig, ax, path)


def _plot_accuracy(s: dict[str, Series], path: Path) -> Path | None:
    pass_keys = sorted((k for k in s if _PASS_AT.match(k)), key=lambda k: int(_PASS_AT.match(k).group(1)))
    if "accuracy" not in s and "eval/accuracy" not in s and not pass_keys:
        return None
    fig, ax = _new_figure("Accuracy", "accuracy")
    _line(ax, s, "accuracy", label="train accuracy", alpha=0.8, train=True)
    _line(ax, s, "eval/accuracy", label="eval accuracy", linewidth=2, marker="s", markersize=4)
    for key in pass_keys:
        _line(ax, s, key, label=key.removeprefix("eval/"), linestyle="--", marker="^", markersize=4)
    return _save(fig, ax, path)


def _plot_length(s: dict[str, Series], path: Path) -> Path | None:
    if "response_length/mean" not in s and "response_length/max" not in s:
        return None
    fig, ax = _new_figure("Response length", "tokens")
    _line(ax, s, "response_length/mean", label="mean", linewidth=2, train=True)
    _line(ax, s, "response_length/max", label="max", alpha=0.6, train=True)
    return _save(fig, ax, path)


def _plot_loss(s: dict[str, Series], path: Path) -> Path | None:
    if "loss" not in s and "kl" not in s:
        return None
    fig, ax = _new_figure("Loss and KL", "loss")
    handles = []
    if "loss" in s:
        steps, vals = s["loss"]
        handles += ax.plot(steps, vals, label="loss", **_style(steps))
    if "kl" in s:
        steps, vals = s["kl"]
        # KL lives on a different scale: own axis on the right.
        ax2 = ax.twinx() if "loss" in s else ax
        if ax2 is not ax:
            ax2.set_ylabel("kl")
        handles += ax2.plot(steps, vals, label="kl", color="tab:red", alpha=0.8, **_style(steps))
    ax.legend(handles=handles, labels=[h.get_label() for h in handles], loc="best", fontsize="small")
    fig.savefig(path)
    return path


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
    for name, fn in (
        ("reward.png", _plot_reward),
        ("accuracy.png", _plot_accuracy),
        ("response_length.png", _plot_length),
        ("loss.png", _plot_loss),
    ):
        p = fn(series, out_dir / name)
        if p is not None:
            written.append(p)
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
