#!/usr/bin/env bash
# Split-K of the grouped launch (issue 37 point 2: Qwen2.5-7B q/k/v at 72 programs on 132 SMs; o/down at 1-16 rows
# on our launch where it splits, cuBLAS before), one GPU call:
#   1. the GPU tests of the split launch (the modules' results, repeat bits, the runner's greedy tokens);
#   2. the 7B decode step at batch 1 and 64, this tree against .ab/base, alternating (new, base, new);
#   3. bench.split_k_probe at 7B, rows 1 / 16 / 64, q/k/v, o, down: µs per layer at 1-4 parts, cuBLAS, the floor.
# Base: rm -rf .ab && mkdir -p .ab/base && git archive REV tandemrl pyproject.toml $(git ls-files bench | grep -v ^bench/results) | tar -x -C .ab/base
# The call: run  command "OUT=$OUT bash bench/gpu_split_k_ab.sh"  carry [".whl", ".ab"]  (~5-8 min; shorter with
# SIDES="new base" and PROBE_ROWS="1 64").
set -uo pipefail
OUT=${OUT:-bench/out/gpu_split_k_ab}; OUT=$(realpath -m "$OUT")
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$SUMMARY"
TREE=$PWD
logged_step 90 tests python3 -m pytest -q -x tests/engine/test_fused_linear.py -k "split_k or runner_grouped"
tail -3 "$OUT/raw/tests.log" >> "$SUMMARY"
step() {  # step <side> <name>: the 7B decode step from the side's tree
    local dir=$TREE; [ "$1" = base ] && dir=$TREE/.ab/base
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir logged_step 100 "$2" python3 -m bench.engine_throughput --skip-hf \
        --warmup-tokens 48 --arch qwen2.5-7b --batches 1 64 --kv-gib 12 --out "$OUT/raw/$2.json")
}
n=0; for side in ${SIDES:-new base new}; do n=$((n + 1)); step "$side" "step-$side-$n"; done
python3 - "$OUT/raw" <<'PY' | tee -a "$SUMMARY"
import json, sys
from pathlib import Path
print("| run | batch | decode step ms | tok/s |\n| --- | --- | --- | --- |")
for f in sorted(Path(sys.argv[1]).glob("step-*.json")):
    for r in json.loads(f.read_text())["engine"]:
        print(f"| {f.stem} | {r['batch']} | {r['decode_step_ms']:.3f} | {r['engine_tok_s']:.0f} |")
PY
logged_step 150 probe python3 -m bench.split_k_probe --arch qwen2.5-7b --rows ${PROBE_ROWS:-1 16 64} --out "$OUT/raw/probe.json"
grep "^rows" "$OUT/raw/probe.log" | tee -a "$SUMMARY"
tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
