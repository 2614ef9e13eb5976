#!/usr/bin/env bash
# Issue 37 point 2's GPU call: every linear op of a layer at Qwen2.5-1.5B and 7B shapes, rows 1 / 64 / 256, ours
# (engine tiles and best swept tiles) against cuBLAS, each against the roofline floor (bench.kernel_sweep --parts
# linear; the dispatch it proposes is in the tables). Steps, each with its own timeout (caps add up to 350 s):
#   1. SHARDS processes per architecture, all at once, compile every swept kernel variant untimed into one Triton
#      cache (the timed runs then spend their budget timing: ~480 compiles would take minutes in one process);
#   2. the timed A/B at 1.5B, then at 7B (all 28 layers: 7B's 15 GB of weights, far beyond the 50 MB L2), one after
#      the other on the idle GPU; a run's sweeps stop at its budget, its JSON and table saved after every op.
# The call: run  command "bash bench/gpu_linear_ab.sh"  kind nvidia-h100-x1  carry [".whl"]  timeout_s 420.
# Results: $OUT/summary.md (both tables and each step's status), $OUT/linear-<arch>.json / .md, the logs in
# $OUT/raw.tar.gz.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_linear_ab}
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
source bench/gpu_env.sh
export TRITON_CACHE_DIR=/tmp/triton-linear-ab  # one cache for the compile shards and the timed runs
SUMMARY="$OUT/summary.md"
ARCHS=(qwen2.5-1.5b qwen2.5-7b)
ROWS=(64 256 1)  # the sweeps in this order: batch 64-256 are the shapes, batch 1 is cut first
SHARDS=${SHARDS:-7}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"


# step 1: every shard under its own timeout, all at once; the summary counts those that failed or ran out
t0=$SECONDS
pids=()
for arch in "${ARCHS[@]}"; do
  for i in $(seq 0 $((SHARDS - 1))); do
    timeout 120 python3 -m bench.kernel_sweep --arch "$arch" --layers 1 --parts linear --rows "${ROWS[@]}" \
        --compile-only --shard "$i/$SHARDS" > "$OUT/raw/compile-$arch-$i.log" 2>&1 &
    pids+=($!)
  done
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
echo "- compile: $failed of ${#pids[@]} shards failed or timed out, $((SECONDS - t0)) s" | tee -a "$SUMMARY"
logged_step 100 ab-1.5b python3 -m bench.kernel_sweep --arch qwen2.5-1.5b --parts linear --rows "${ROWS[@]}" \
    --budget-s 55 --out "$OUT/linear-qwen2.5-1.5b.json"
logged_step 130 ab-7b python3 -m bench.kernel_sweep --arch qwen2.5-7b --parts linear --rows "${ROWS[@]}" \
    --budget-s 75 --out "$OUT/linear-qwen2.5-7b.json"
for arch in "${ARCHS[@]}"; do
  grep -h "swept" "$OUT/raw/ab-${arch#qwen2.5-}.log" | sed "s/^/  $arch /" >> "$SUMMARY"
  { echo; cat "$OUT/linear-$arch.md" 2>/dev/null || echo "$arch: no table (see raw/ab-${arch#qwen2.5-}.log)"; } \
      >> "$SUMMARY"
done
(cd "$OUT" && tar -czf raw.tar.gz raw && rm -rf raw)  # at most 8 files come back: the logs in one
cat "$SUMMARY"
