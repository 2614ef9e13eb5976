#!/usr/bin/env bash
# Issue 12's GPU check in one device call (about 6 minutes on an H100): the engine tests of speculative decoding (real
# CUDA graphs and Triton kernels), `python -m bench.speculative --batches 1 8` (Qwen2.5-1.5B-architecture target,
# Qwen2.5-0.5B-architecture draft, k = 2, 4, 6, a = 0.6-1.0), then `python -m bench.verify_cost` (the target's verify
# forward against its plain step, which the model takes as equal); logs and JSON land in $OUT.
# The call: run  command "bash bench/gpu_speculative.sh"  carry [".whl"]  (pydantic for the config). Env: BENCH_ARGS
# (replaces "--batches 1 8"), TEST_SECONDS, BENCH_SECONDS.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_speculative}
mkdir -p "$OUT"
source bench/gpu_env.sh
timeout "${TEST_SECONDS:-150}" python3 -m pytest -q -p no:cacheprovider tests/engine/test_speculative.py \
    tests/engine/test_step_contract.py > "$OUT/tests.log" 2>&1
echo "tests exit status $?"; tail -n 2 "$OUT/tests.log"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
timeout "${BENCH_SECONDS:-420}" python3 -m bench.speculative ${BENCH_ARGS:---batches 1 8} \
    --out "$OUT/speculative.json" > "$OUT/speculative.log" 2>&1
echo "bench exit status $?"; grep -E "^\|" "$OUT/speculative.log"
timeout 120 python3 -m bench.verify_cost --out "$OUT/verify_cost.json" > "$OUT/verify_cost.log" 2>&1
echo "verify_cost exit status $?"; grep -E "^\|" "$OUT/verify_cost.log"
