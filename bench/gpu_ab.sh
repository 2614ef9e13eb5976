#!/usr/bin/env bash
# A/B of the engine in one GPU call: this tree against a baseline tree (default .ab/base, e.g.
# `mkdir -p .ab/base && git archive <commit> | tar -x -C .ab/base`), alternating runs, same machine.
# Batch-256 throughput (engine only) and the GRPO step 8x8x512; the summary table last; every JSON and log in
# $OUT/ab.tar.gz (the device tool brings back at most 8 files).
# Usage: bench/gpu_ab.sh [baseline dir] [rounds]   (carry .whl and the baseline dir)
set -u
BASE=${1:-.ab/base}
ROUNDS=${2:-2}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
NEW=$PWD
run() {  # run <label> <tree> <round>
  (cd "$2" && PYTHONPATH=/tmp/site:$2 timeout 200 python3 -m bench.engine_throughput --kv-gib 4 --skip-hf --batches 256 \
      --out "$OUT/tp-$1-$3.json" > "$OUT/tp-$1-$3.log" 2>&1)
  (cd "$2" && PYTHONPATH=/tmp/site:$2 timeout 200 python3 -m bench.grpo_step --backend engine --repeats 5 \
      --out "$OUT/grpo-$1-$3.json" > "$OUT/grpo-$1-$3.log" 2>&1)
}
for r in $(seq 1 "$ROUNDS"); do
  run base "$NEW/$BASE" "$r"
  run new "$NEW" "$r"
done
PYTHONPATH=/tmp/site:$NEW python3 -m bench.ab_summary "$OUT"
(cd "$OUT" && tar -czf ab.tar.gz ./*.json ./*.log && rm -f ./*.log ./tp-*.json ./grpo-*.json)
