"""Start-up cost of one sandboxed python-tool call: wall time of ``Sandbox.run("print(1)")``, bwrap against the
unsandboxed opt-out and a bare interpreter start, over N calls each. Prints a table; writes JSON only with --json.

    .venv/bin/python bench/sandbox_startup.py [--calls 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

from tandemrl.rollout.sandbox import Sandbox, SandboxLimits


def timings(call: Callable[[], None], n: int) -> list[float]:
    call()  # warm the page cache
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered), "p99_ms": p99, "min_ms": ordered[0], "max_ms": ordered[-1]}


def checked(sandbox: Sandbox) -> Callable[[], None]:
    def call() -> None:
        run = sandbox.run("print(1)")
        if run.stdout != "1\n":
            raise RuntimeError(f"sandbox run failed: {run}")
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the "none" opt-out's warning is expected here
    cases = {
        "bare interpreter (python -I -S -c pass)": lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"],
                                                                        check=True),
        "sandbox, tools.sandbox = 'none'": checked(Sandbox(SandboxLimits(isolation="none"))),
        "sandbox, tools.sandbox = 'bwrap' (default)": checked(Sandbox(SandboxLimits())),
    }
    results = {name: summary(timings(call, args.calls)) for name, call in cases.items()}
    print(f"{args.calls} calls each, {platform.node()}, {platform.platform()}, Python {platform.python_version()}")
    print(f"{'case':44} {'median ms':>10} {'p99 ms':>8} {'min ms':>8} {'max ms':>8}")
    for name, r in results.items():
        print(f"{name:44} {r['median_ms']:10.1f} {r['p99_ms']:8.1f} {r['min_ms']:8.1f} {r['max_ms']:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": args.calls, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
