#!/usr/bin/env bash
# Issue 41 (tensor-parallel rollouts) on 2 GPUs in one device call, under 8 minutes: bench.tp_decode at Qwen2.5-7B
# (random bf16 weights): the decode step time of one tensor-parallel engine over both GPUs against the whole model
# on one, at batch 1 and 64 for 128 + 512 and 1024 + 4096 tokens, with CUDA graphs capturing the all-reduces, and
# greedy parity (bf16: exact sequences, or the whole model's logit gap at each first difference); then
# bench.multi_gpu at Qwen2.5-0.5B: a GRPO step with one TP engine over 2 ranks ("2 gpu tp") beside data parallelism
# ("2 gpu weak"), both FSDP2-sharded. If the graphed decode run fails (not cut short), an eager one says whether the
# captured all-reduces are why. About 7.5 minutes at most.
# Results: $OUT/tp_decode*.json, $OUT/multi_gpu_tp_0.5b.json (bench/out/ when OUT is unset).
#
#   run(command="bash bench/gpu_tp.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

tp_decode 270 tp_decode
status=$?
if [ "$status" != 0 ] && [ "$status" != 124 ]; then  # failed (not cut short): are the captured all-reduces why?
    tp_decode 120 tp_decode_eager --eager --shapes 1:128:512 64:128:512
fi

echo "=== GRPO step, Qwen2.5-0.5B: TP engine vs data parallel (at most 140 s) $(date +%T)"
timeout --kill-after=15 140 python3 -m bench.multi_gpu --arch qwen2.5-0.5b --settings "2 gpu tp" "2 gpu weak" \
    --strategies shard --launch-timeout 65 --out "$OUT_DIR/multi_gpu_tp_0.5b.json" 2>&1 \
    | grep -v "OMP_NUM_THREADS\|^\*\*\*\*" || echo "=== GRPO 0.5B: exit status ${PIPESTATUS[0]}"
echo "=== done $(date +%T)"
