#!/usr/bin/env bash
# Issue 35's GPU check (the engine's shape: one round loop), in one or two device calls:
#   PART=ab    the A/B of two trees, alternating: batch-256 decode tok/s
#              (bench.engine_throughput), the GRPO step 8x8x512 (bench.grpo_step) and the tandem step against
#              vanilla at p = 0.5 and 0.8 (bench.tandem_step; the new tree also as verify rounds, --rounds-too:
#              point 2); the table last (bench.shape_summary).
#   PART=tests the GPU engine tests of the new tree (TESTS: which files), nothing else
#   PART=spec  the GPU engine tests of the new tree, then `bench.speculative --batches 1 8` on it (every row >= 80 %
#              of the formula).
# Both trees are git archives under .ab/ (ignored; carry ".ab" and ".whl"), so neither holds anyone's uncommitted work;
# the baseline is HEAD with the engine (and the benches that read its internals) of 78eef71, main before issue 35's
# engine work, so the trainer's changes since (the packed update) are on both sides and the A/B is the engine's:
#   rm -rf .ab/base .ab/new && mkdir -p .ab/base .ab/new && git archive HEAD | tar -x -C .ab/new \
#     && git archive HEAD | tar -x -C .ab/base && rm -rf .ab/base/tandemrl/engine \
#     && git archive 78eef71 tandemrl/engine bench/tandem_step.py bench/speculative.py | tar -x -C .ab/base
# The call: run  command "PART=ab bash bench/gpu_shape.sh"  carry [".whl", ".ab"]  timeout_s 600 (or NEW=. with only
# .ab/base archived: `git archive REV tandemrl $(git ls-files bench | grep -v ^bench/results) | tar -x -C .ab/base`). Logs and JSON go to
# $OUT/shape.tar.gz, the summary to $OUT/summary.md (at most 8 files come back). Env: ROUNDS (A/B rounds, 1),
# TEST_SECONDS, REPEATS (GRPO and tandem steps timed per setting, 3), TANDEM (0: no tandem runs).
set -uo pipefail
OUT=${OUT:-bench/out/gpu_shape}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the trees run from their own folders
source bench/gpu_env.sh
ROOT=$PWD
# the trees' folders (NEW=. runs the new side from the working tree itself: only .ab/base is carried then)
declare -A TREE=([base]=${BASE:-.ab/base} [new]=${NEW:-.ab/new})
in_tree() {  # in_tree <tree> <command...>: run a command in a tree, its own code first on the path
  local tree=$1; shift
  (cd "$ROOT/$tree" && PYTHONPATH=/tmp/site:$ROOT/$tree "$@")
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/summary.md"
if [ "${PART:-ab}" = ab ]; then
  R=${REPEATS:-3}
  for r in $(seq 1 "${ROUNDS:-1}"); do
    for side in base new; do
      in_tree "${TREE[$side]}" timeout 120 python3 -m bench.engine_throughput --kv-gib 4 --skip-hf --batches 256 \
          --out "$OUT/tp-$side-$r.json" > "$OUT/tp-$side-$r.log" 2>&1 || echo "throughput $side failed"
      in_tree "${TREE[$side]}" timeout 120 python3 -m bench.grpo_step --backend engine --repeats "$R" \
          --out "$OUT/grpo-$side-$r.json" > "$OUT/grpo-$side-$r.log" 2>&1 || echo "grpo $side failed"
      [ "${TANDEM:-1}" = 1 ] || { echo "round $r $side done at $SECONDS s"; continue; }  # TANDEM=0: decode and GRPO only
      # point 2: tandem as verify rounds, beside the bursts (ROUNDS_TOO=0 leaves them out)
      rounds=$([ "$side" = new ] && [ "${ROUNDS_TOO:-1}" = 1 ] && echo --rounds-too)
      # shellcheck disable=SC2086  # rounds is empty or one word
      in_tree "${TREE[$side]}" timeout 240 python3 -m bench.tandem_step --repeats "$R" $rounds \
          --out "$OUT/tandem-$side-$r.json" > "$OUT/tandem-$side-$r.log" 2>&1 || echo "tandem $side failed"
      echo "round $r $side done at $SECONDS s"
    done
  done
  PYTHONPATH=/tmp/site:$ROOT python3 -m bench.shape_summary "$OUT" | tee -a "$OUT/summary.md"
else
  # TESTS: the test files (default: the round loop's); PART=tests runs nothing after them
  # shellcheck disable=SC2086  # TESTS is a list of paths
  in_tree "${TREE[new]}" timeout "${TEST_SECONDS:-170}" python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/engine/test_speculative.py \
      tests/engine/test_step_contract.py tests/engine/test_tandem.py tests/engine/test_tandem_async.py \
      tests/engine/test_tandem_placement.py tests/engine/test_model_runner.py tests/engine/test_rejection.py} \
      > "$OUT/tests.log" 2>&1
  echo "GPU engine tests exit status $? ($(tail -n 1 "$OUT/tests.log"))" | tee -a "$OUT/summary.md"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20 | tee -a "$OUT/summary.md"
  if [ "$PART" != tests ]; then
    in_tree "${TREE[new]}" timeout "${BENCH_SECONDS:-400}" python3 -m bench.speculative --batches 1 8 \
        --out "$OUT/speculative.json" > "$OUT/speculative.log" 2>&1
    echo "bench.speculative exit status $?" | tee -a "$OUT/summary.md"
    grep -E "^\|" "$OUT/speculative.log" | tee -a "$OUT/summary.md"
  fi
fi
(cd "$OUT" && tar -czf shape.tar.gz --exclude=shape.tar.gz ./*.log ./*.json 2>/dev/null; rm -f ./*.log ./tp-*.json ./grpo-*.json ./tandem-*.json)
