#!/usr/bin/env bash
# The round graph's first GPU check, in one device call (about 6 minutes on an H100): the speculative engine tests
# (greedy rounds now run as one CUDA graph each), then bench.speculative at batch 8 and 1 against the same bench on
# main's tree (.ab/main: `git archive main | tar -x -C .ab/main`, carried) in the same call.
# The call: run  command "bash bench/gpu_round_graph.sh"  carry [".whl", ".ab"]
set -uo pipefail
OUT=${OUT:-bench/out/gpu_round_graph}
mkdir -p "$OUT"
source bench/gpu_env.sh
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_speculative.py > "$OUT/tests.log" 2>&1
echo "tests exit status $?"; tail -n 3 "$OUT/tests.log"
timeout 260 python3 -m bench.speculative --batches 8 1 --out "$OUT/speculative.json" > "$OUT/speculative.log" 2>&1
echo "bench exit status $?"; grep -E "^\|" "$OUT/speculative.log"
(cd .ab/main && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m bench.speculative --batches 8 \
    --out "$OUT/speculative_main.json" > "$OUT/speculative_main.log" 2>&1)
echo "main's bench exit status $?"; grep -E "^\|" "$OUT/speculative_main.log"
