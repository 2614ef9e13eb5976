"""The evidence of one training run, for bench/RESULTS.md: accuracy before and after with 95 % intervals, step time,
tokens/s and wall time, from the run directory's summary.json and metrics.jsonl.

    python -m bench.run_report RUN_DIR [--out RUN_DIR/report.json]

The intervals are Wilson score intervals of the greedy accuracy over the evaluated prompts (scipy); "significant"
says whether the two intervals are disjoint, a conservative test of a change.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scipy.stats import binomtest

from tandemrl.telemetry.writers import read_metrics


def accuracy_interval(accuracy: float, n: int) -> dict:
    correct = round(accuracy * n)
    ci = binomtest(correct, n).proportion_ci(confidence_level=0.95, method="wilson")
    return {"correct": correct, "n": n, "accuracy": correct / n, "ci95": [float(ci.low), float(ci.high)]}


def report(run_dir: Path) -> dict:
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} does not exist: the run has not finished (or --out is wrong)")
    summary = json.loads(summary_path.read_text())
    steps = [row for row in read_metrics(run_dir / "metrics.jsonl") if "time/step" in row]
    before, after = (accuracy_interval(summary[k]["accuracy"], summary[k]["num_prompts"]) for k in ("initial", "final"))
    step_times = [row["time/step"] for row in steps]
    return {
        "run": str(run_dir), "task": summary.get("task"), "steps": summary["steps"], "seconds": summary.get("seconds"),
        "before": before, "after": after,
        "significant": after["ci95"][0] > before["ci95"][1] or after["ci95"][1] < before["ci95"][0],
        "step_s_median": statistics.median(step_times) if step_times else None,
        "rollout_s_median": statistics.median(r["time/rollout"] for r in steps if "time/rollout" in r) if steps else None,
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in steps) if steps else None,
        "response_length_first_last": [steps[0]["response_length/mean"], steps[-1]["response_length/mean"]]
        if steps else None,
    }


def _pct(result: dict) -> str:
    low, high = result["ci95"]
    return f"{100 * result['accuracy']:.1f} % ({result['correct']}/{result['n']}; 95 % CI {100 * low:.1f}-{100 * high:.1f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="JSON file (default RUN_DIR/report.json)")
    args = parser.parse_args(argv)
    result = report(args.run_dir)
    rows = [("task", result["task"]), ("steps", result["steps"]), ("training wall time s", result["seconds"]),
            ("accuracy before", _pct(result["before"])), ("accuracy after", _pct(result["after"])),
            ("intervals disjoint", result["significant"]), ("median step s", result["step_s_median"]),
            ("median rollout s", result["rollout_s_median"]), ("median tokens/s", result["tokens_per_s_median"]),
            ("response length first/last step", result["response_length_first_last"])]
    print("| metric | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {round(value, 3) if isinstance(value, float) else value} |")
    out = args.out or args.run_dir / "report.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
