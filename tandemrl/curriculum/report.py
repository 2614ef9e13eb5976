"""The per-epoch cluster report: a rich table on the console and ``<run>/curriculum/epoch-NNN.json``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from tandemrl.curriculum.curriculum import EpochReport


def report_dict(report: EpochReport) -> dict:
    return {
        "epoch": report.epoch, "samples_seen": report.samples_seen, "global": report.global_stats,
        "normalize": report.normalize, "method": report.method, "boundaries": report.boundaries,
        "buckets": [asdict(b) for b in report.buckets],
    }


def write_report(run_dir: Path, report: EpochReport) -> Path:
    """Writes the report atomically (a crash leaves the old file or the new one, never half of one)."""
    folder = Path(run_dir) / "curriculum"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch-{report.epoch:03d}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report_dict(report), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def report_table(report: EpochReport) -> Table:
    stats = report.global_stats
    bounds = ", ".join(f"{b:.3f}" for b in report.boundaries) or "none"
    unseen = f", {stats['unseen']:.0f} never drawn" if stats.get("unseen") else ""
    table = Table(title=f"curriculum after epoch {report.epoch}: EMA mean {stats['mean']:.3f} "
                        f"(min {stats['min']:.3f}, max {stats['max']:.3f}{unseen}), boundaries {bounds} "
                        f"[{report.method}]")
    for column in ("bucket", "n", "%", "mean reward (norm.)", "mean EMA", "rollouts"):
        table.add_column(column, justify="left" if column == "bucket" else "right")
    for b in report.buckets:
        table.add_row(b.label, str(b.n), f"{b.percent:.1f}", f"{b.mean_reward:.3f}", f"{b.mean_ema:.3f}",
                      str(b.rollouts))
    return table
