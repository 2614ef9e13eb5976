#!/usr/bin/env bash
# The server against the in-process engine (issue 40 point 3), A/B in one device call: bench.serve's load rounds
# (64 streaming clients x 256 tokens, 128-token prompts, new and kept-alive connections; its in-process figure from
# the same process) from the base tree (.ab/base: a git archive of the tree before the change) and from this tree,
# alternating base, new, base, new while time is left (each run about 100 s).
# The call: run  command "bash bench/gpu_serve_ab.sh"  carry [".whl", ".ab"]  timeout_s 600  (kind nvidia-h100-x1)
# This tree alone, repeated (no .ab needed): SIDES="new new new new" BENCH_ARGS="--client-procs 1 8" bash ...
# Make .ab/base: rm -rf .ab && mkdir -p .ab/base && git archive BASE tandemrl pyproject.toml \
#                  $(git ls-files bench | grep -v ^bench/results) | tar -x -C .ab/base
set -uo pipefail
OUT=${OUT:-bench/out/gpu_serve_ab}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the base runs write from .ab/base
# the carried wheels into /tmp/site (GPU_SITE_READY=1: the python on PATH has the serve packages already, a CPU
# check with BENCH_ARGS="--cpu-smoke ...")
source bench/gpu_env.sh
export TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
START=$SECONDS
round=0
for side in ${SIDES:-base new base new base new}; do
    [[ $((SECONDS - START + 130)) -le $BUDGET ]] || { echo "no time for $side run $round"; break; }
    name="$side-$round"
    t0=$SECONDS
    in_side "$side" timeout -k 10 130 python3 -m bench.serve --modes inprocess ${BENCH_ARGS:-} \
        --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    echo "$name: rc $?, $((SECONDS - t0)) s"
    grep -E "server tok/s|kept-alive|new connections" "$OUT/$name.log" | head -6
    round=$((round + 1))
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from bench.serve import rounds_by_procs
print("| run | client processes | in-process tok/s | server new conn. | / in-process | server kept-alive | / in-process |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for path in sorted(Path(sys.argv[1]).glob("*.json"), key=lambda p: int(p.stem.split("-")[1])):
    r = json.loads(path.read_text())
    nan = float("nan")
    by_procs = rounds_by_procs(r)
    for procs, rounds in by_procs.items():
        tok_s = lambda key: rounds.get(key, {}).get("tok_s", nan)
        print(f"| {path.stem} | {procs} | {r.get('in_process', {}).get('tok_s', nan):.0f} | {tok_s('load'):.0f} "
              f"| {rounds.get('new_over_in_process', nan):.2f} | {tok_s('load_reused'):.0f} "
              f"| {rounds.get('kept_over_in_process', nan):.2f} |")
PY
