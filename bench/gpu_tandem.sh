#!/usr/bin/env bash
# Issue 11's GPU check in one device call: the engine tests that touch tandem bursts, query-grouped decode attention
# and verify steps (real CUDA graphs and Triton kernels), then `python -m bench.tandem_step` (Qwen3-0.6B
# architecture, 8 x 8 x 512, vanilla and tandem p = 0.5, 0.8); the JSON lands in $OUT.
# The call: run  command "bash bench/gpu_tandem.sh"  carry [".whl"]  (pydantic for the config). Env: TESTS (the test
# files), TEST_SECONDS, BENCH_SECONDS, BENCH_ARGS (more arguments for bench.tandem_step; "--sync-too" adds each
# tandem setting with async scheduling off), PROFILE=1 (then bench.profile_engine of a tandem rollout at p = 0.5, async
# scheduling on and off: the GPU's busy share and idle gaps), PROFILE_SECONDS.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_tandem}
mkdir -p "$OUT"
source bench/gpu_env.sh
TESTS=${TESTS:-tests/engine/test_tandem.py tests/engine/test_tandem_async.py tests/engine/test_tandem_burst.py \
tests/engine/test_speculative.py tests/engine/test_model_runner.py tests/engine/test_paged_attention.py}
# shellcheck disable=SC2086  # TESTS is a list of paths
timeout "${TEST_SECONDS:-240}" python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/tests.log" 2>&1
echo "tests exit status $?"; tail -n 4 "$OUT/tests.log"
# shellcheck disable=SC2086
timeout "${BENCH_SECONDS:-240}" python3 -m bench.tandem_step ${BENCH_ARGS:-} --out "$OUT/tandem_step.json" > "$OUT/tandem_step.log" 2>&1
echo "bench exit status $?"; tail -n 12 "$OUT/tandem_step.log"
if [ "${PROFILE:-0}" = 1 ]; then
    for mode in async sync; do
        flag=$([ "$mode" = sync ] && echo --sync)
        # shellcheck disable=SC2086  # flag is empty or one word
        timeout "${PROFILE_SECONDS:-120}" python3 -m bench.profile_engine --arch qwen3-0.6b --batch 64 --new-tokens 256 \
            --tandem 0.5 $flag > "$OUT/profile_tandem_$mode.log" 2>&1
        echo "profile ($mode) exit status $?"; grep -A4 "GPU busy" "$OUT/profile_tandem_$mode.log"
    done
fi
