"""Table of bench/gpu_shape.sh's A/B (issue 35): batch-256 decode tok/s, the GRPO step 8x8x512 and the tandem step
ratio at each p, per side (baseline, new), with new / baseline. Usage: python -m bench.shape_summary DIR."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench.ab_summary import collect


def tandem_ratios(folder: Path) -> dict[str, dict[str, list[float]]]:
    """side -> "tandem p=X / vanilla" -> one ratio per round."""
    sides: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    for side in sides:
        for path in sorted(folder.glob(f"tandem-{side}-*.json")):
            rows = json.loads(path.read_text())["rows"]
            for name, row in rows.items():
                if name != "vanilla":
                    ratio = row["step_s"] / rows["vanilla"]["step_s"]
                    sides[side].setdefault(f"{name} step / vanilla", []).append(ratio)
    return sides


def main() -> None:
    folder = Path(sys.argv[1])
    sides = collect(folder)
    for side, ratios in tandem_ratios(folder).items():
        sides[side].update(ratios)
    summary = {}
    print("| metric | baseline runs | new runs | new / baseline (medians) |")
    print("|---|---|---|---|")
    for metric in sorted(sides["base"].keys() | sides["new"].keys()):
        base, new = sides["base"].get(metric, []), sides["new"].get(metric, [])
        ratio = statistics.median(new) / statistics.median(base) if base and new else None
        summary[metric] = {"base": base, "new": new, "ratio": ratio}
        print(f"| {metric} | {', '.join(f'{v:.4g}' for v in base)} | {', '.join(f'{v:.4g}' for v in new)} | "
              + (f"{ratio:.3f} |" if ratio else "n/a |"))
    (folder / "shape_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
