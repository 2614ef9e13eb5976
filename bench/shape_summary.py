"""Table of bench/gpu_shape.sh's A/B (issue 35): batch-256 decode tok/s, the GRPO step 8x8x512 and the tandem step
ratio at each p, per side (baseline, new), with new / baseline. Usage: python -m bench.shape_summary DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.ab_summary import collect, print_table


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
    print_table(sides, folder / "shape_summary.json")


if __name__ == "__main__":
    main()
