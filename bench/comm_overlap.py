"""How much of a step's collective communication runs under compute, from a torch.profiler Chrome trace: the time
NCCL kernels run (their union, inside the annotated window, e.g. the GRPO update) and the part of it during which a
compute kernel runs on the same GPU too. An NCCL kernel's time includes its wait for the other rank.

    python -m bench.comm_overlap TRACE.json[.gz] [--window grpo_update]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Of two unions (sorted, disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(trace: dict, window: str | None = "grpo_update") -> dict:
    """{comm_ms, overlapped_ms, overlapped_share, compute_ms, window_ms, nccl_kernels} of the trace's kernels that
    start inside the ``window`` annotation (the whole trace when it has none)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if window and e.get("cat") == "user_annotation" and e.get("name") == window]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if spans:
        kernels = [e for e in kernels if any(a <= e["ts"] <= b for a, b in spans)]
    comm = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()])
    compute = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()])
    comm_us, overlapped_us = length(comm), length(intersection(comm, compute))
    return {"comm_ms": comm_us / 1e3, "overlapped_ms": overlapped_us / 1e3,
            "overlapped_share": overlapped_us / comm_us if comm_us else None, "compute_ms": length(compute) / 1e3,
            "window_ms": length(union(spans)) / 1e3 if spans else None,
            "nccl_kernels": sum("nccl" in e["name"].lower() for e in kernels)}


def read_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as raw:
        return json.load(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--window", default="grpo_update", help="the record_function span to look inside")
    args = parser.parse_args()
    for path in args.traces:
        print(path.name, json.dumps(overlap(read_trace(path), args.window)))


if __name__ == "__main__":
    main()
