#!/usr/bin/env bash
# Issue 36 point 4 in one device call (nvidia-h100-x2, carry [".whl"], about 4 minutes): tandem with the frozen model
# on the second GPU (`tandem.frozen_device = "cuda:1"`) in paired ticks, the two GPUs at once. The placement tests
# (their cuda:1 cases run here), then `bench.tandem_step` with the frozen model on cuda:1 and on the hot one's GPU,
# each with a watched rollout per setting: each model's device busy time against the wall time (bench/device_busy.py).
# Logs and JSON in $OUT.
set -uo pipefail
source bench/gpu_multi_env.sh
timeout --kill-after=10 "${TEST_SECONDS:-45}" python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_tandem_placement.py > "$OUT_DIR/tests.log" 2>&1
echo "placement tests exit status $?"; tail -n 4 "$OUT_DIR/tests.log"
for where in cuda:1 one-gpu; do  # each cut at BENCH_SECONDS (cuda:1 first: 110 s, one GPU 85 s): the rows print as done
    flag=$([ "$where" = cuda:1 ] && echo "--frozen-device cuda:1")
    seconds=$([ "$where" = cuda:1 ] && echo 110 || echo 85)
    name=tandem_step_${where/:/}
    echo "=== tandem_step, frozen model on $where $(date +%T)"
    # shellcheck disable=SC2086  # flag is empty or two words
    timeout --kill-after=10 "${BENCH_SECONDS:-$seconds}" python3 -m bench.tandem_step $flag --ps 0.5 --repeats 3 \
        --out "$OUT_DIR/$name.json" > "$OUT_DIR/$name.log" 2>&1
    echo "exit status $?"; grep -E "^\| |^busy|busy:|step / vanilla|Error|error" "$OUT_DIR/$name.log" | tail -n 14
done
