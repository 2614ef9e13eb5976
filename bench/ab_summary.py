"""Table of an A/B run of bench/gpu_ab.sh: per round and side, batch-256 throughput and the GRPO step; the change of
the new side's median against the baseline's. Usage: python -m bench.ab_summary DIR (the JSON files of gpu_ab.sh)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def collect(folder: Path) -> dict[str, dict[str, list[float]]]:
    """side -> metric -> one value per round (missing runs are left out)."""
    sides: dict[str, dict[str, list[float]]] = {}
    for side in ("base", "new"):
        metrics: dict[str, list[float]] = {"tok_s_256": [], "grpo_step_s": [], "grpo_rollout_s": [], "grpo_peak_gib": []}
        for tp in sorted(folder.glob(f"tp-{side}-*.json")):
            row = next(r for r in _load(tp)["engine"] if r["batch"] == 256)
            metrics["tok_s_256"].append(row["engine_tok_s"])
        for grpo in sorted(folder.glob(f"grpo-{side}-*.json")):
            data = _load(grpo)
            metrics["grpo_step_s"].append(data["step_s"])
            metrics["grpo_rollout_s"].append(data["rollout_s"])
            metrics["grpo_peak_gib"].append(data["peak_gib"])
        sides[side] = metrics
    return sides


def print_table(sides: dict[str, dict[str, list[float]]], out: Path) -> None:
    """The table (new / baseline of the medians) on stdout, and its numbers as JSON in ``out``."""
    summary = {}
    print("| metric | baseline runs | new runs | new / baseline (medians) |")
    print("|---|---|---|---|")
    for metric in sorted(sides["base"].keys() | sides["new"].keys()):
        base, new = sides["base"].get(metric, []), sides["new"].get(metric, [])
        ratio = statistics.median(new) / statistics.median(base) if base and new else None
        summary[metric] = {"base": base, "new": new, "ratio": ratio}
        print(f"| {metric} | {', '.join(f'{v:.4g}' for v in base)} | {', '.join(f'{v:.4g}' for v in new)} | "
              + (f"{ratio:.3f} |" if ratio else "n/a |"))
    out.write_text(json.dumps(summary, indent=2) + "\n")


def main() -> None:
    folder = Path(sys.argv[1])
    print_table(collect(folder), folder / "ab_summary.json")


if __name__ == "__main__":
    main()
