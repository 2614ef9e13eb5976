#!/usr/bin/env bash
# Issue 37 point 2's engine A/B: the linear dispatch (fused_linear.grouped_launch_wins: our grouped kernel or cuBLAS
# per op and shape) and the GEMV tile rule (pick_tiles) of this tree against the baseline tree .ab/base (main at the
# commit this work started from), alternating on one GPU: decode throughput of Qwen2.5-0.5B / 1.5B / 7B (random
# bf16 weights), 128 + 512 tokens, batches 1 / 64 / 256, each row with its decode step against the bandwidth floor.
# First the GPU runs of this tree's linear-kernel and runner tests (token for token against the reference, CUDA
# graphs captured and replayed).
# Prepare the baseline here once (ignored by git; it travels as a carried path):
#   rm -rf .ab/base && mkdir -p .ab/base && git archive 972a81a tandemrl bench | tar -x -C .ab/base
# The call: run  command "bash bench/gpu_linear_dispatch.sh"  kind nvidia-h100-x1  carry [".whl", ".ab"]
# timeout_s 540 (the steps' caps add up to 450 s). Results: $OUT/summary.md (the tests' status and the A/B table),
# logs and JSON in $OUT/raw.tar.gz.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_linear_dispatch}
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)  # the trees run from their own folders
source bench/gpu_env.sh
ROOT=$PWD
SUMMARY="$OUT/summary.md"
[ -d .ab/base/tandemrl ] || { echo "no baseline tree in .ab/base (see the header)"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"

logged_step 100 tests python3 -m pytest -q -p no:cacheprovider tests/engine/test_linear_dispatch.py \
    tests/engine/test_fused_linear.py tests/engine/test_model_runner.py \
    -k "not test_model_runner or graph or greedy or peft"  # the runner's tests through the fused path
tail -n 1 "$OUT/raw/tests.log" >> "$SUMMARY"
grep -E "^(FAILED|ERROR)" "$OUT/raw/tests.log" | head -10 >> "$SUMMARY"

# side <base|new> <arch> <KV GiB> <cap s>: one engine_throughput run of that tree
side() {
  local tree=$ROOT
  [ "$1" = base ] && tree=$ROOT/.ab/base
  (cd "$tree" && export PYTHONPATH=/tmp/site:$tree && logged_step "$4" "$2-$1" python3 -m bench.engine_throughput \
      --arch "qwen2.5-$2" --batches 1 64 256 --skip-hf --warmup-tokens 48 --kv-gib "$3" --out "$OUT/raw/$2-$1.json")
}
side base 0.5b 4 45; side new 0.5b 4 45
side new 1.5b 6 55; side base 1.5b 6 55  # the order flips per arch: neither side always goes first
side base 7b 12 75; side new 7b 12 75

python3 - "$OUT/raw" >> "$SUMMARY" <<'EOF'
import json, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    arch, side = f.stem.split("-")
    for e in json.loads(f.read_text())["engine"]:
        rows.setdefault((arch, e["batch"]), {})[side] = e
print("\n| arch | batch | base tok/s | new tok/s | new / base | base step ms (/ floor) | new step ms (/ floor) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for (arch, batch), sides in sorted(rows.items(), key=lambda kv: (float(kv[0][0][:-1]), kv[0][1])):
    b, n = sides.get("base"), sides.get("new")
    cell = lambda e: f"{e['decode_step_ms']:.3f} ({e['step_over_floor']:.2f}x)" if e else "-"
    tok = lambda e: f"{e['engine_tok_s']:,.0f}" if e else "-"
    ratio = f"{n['engine_tok_s'] / b['engine_tok_s']:.3f}" if b and n else "-"
    print(f"| {arch} | {batch} | {tok(b)} | {tok(n)} | {ratio} | {cell(b)} | {cell(n)} |")
EOF
(cd "$OUT" && tar -czf raw.tar.gz raw && rm -rf raw)  # at most 8 files come back: the logs and JSON in one
cat "$SUMMARY"
