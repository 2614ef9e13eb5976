#!/usr/bin/env bash
# Issue 41, the fused all-reduce (kernels/allreduce_norm.py) on 2 GPUs in one device call, under 8 minutes: the 2-GPU
# tests (tests/engine/test_tp_fused_gpu.py: the kernel bit for bit against its reference, in CUDA graphs; greedy
# decode fused = NCCL), then bench.tp_decode at Qwen2.5-7B (random bf16 weights, CUDA graphs) with the fused
# all-reduce and with NCCL in one launch (one one-GPU baseline), at 1:128:512 64:128:512 64:1024:4096 (NCCL: the two
# short shapes; its long row is in bench/RESULTS.md). About 7 minutes at most.
# Results in $OUT: tests.log, tp_fused.json and .log, summary.md (step ms, ratio to one GPU, fused vs NCCL).
#
#   run(command="bash bench/gpu_tp_fused.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

echo "=== 2-GPU tests (at most 90 s) $(date +%T)"
timeout --kill-after=10 90 python3 -m pytest -q -x tests/engine/test_tp_fused_gpu.py -p no:cacheprovider \
    > "$OUT_DIR/tests.log" 2>&1
echo "=== tests: exit status $?"; tail -n 15 "$OUT_DIR/tests.log"

tp_decode 300 tp_fused --allreduce both --shapes 1:128:512 64:128:512 64:1024:4096 \
    --nccl-shapes 1:128:512 64:128:512 --parity-prompts 8 | tee "$OUT_DIR/tp_fused.log"

{
    echo "# Fused all-reduce vs NCCL, Qwen2.5-7B decode over 2 GPUs ($(date +%F))"
    echo
    grep -A8 "^| batch" "$OUT_DIR/tp_fused.log" | grep "^|" || echo "(no table: see tp_fused.log)"
    grep "^greedy" "$OUT_DIR/tp_fused.log"
    echo
    echo "2-GPU tests: $(tail -n 1 "$OUT_DIR/tests.log")"
} > "$OUT_DIR/summary.md"
cat "$OUT_DIR/summary.md"
echo "=== done $(date +%T)"
