#!/usr/bin/env bash
# Issue 41's 7B step on 2 GPUs in one device call, under 9 minutes: a Qwen2.5-7B-architecture full fine-tune GRPO step
# (FSDP2 over 2 GPUs, gradient checkpointing, random bf16 weights) with one tensor-parallel engine over both ranks
# and a KV cache of 18432 blocks of 16 tokens (64 sequences x 4608 tokens), then the data-parallel-only variant (a
# whole replica per rank, 2048 blocks as in bench/gpu_multi_7b.sh). Peak memory per GPU, step time, refresh time.
# Results: $OUT/multi_gpu_tp_7b*.json.
#
#   run(command="bash bench/gpu_tp_7b.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
LAUNCH_TIMEOUT=240
source bench/gpu_multi_env.sh
SHAPE=(--arch qwen2.5-7b --gradient-checkpointing --prompts 4 --repeats 2 --strategies shard)

piece 250 tp_7b "${SHAPE[@]}" --settings "2 gpu tp" --num-blocks 18432
piece 250 tp_7b_dp "${SHAPE[@]}" --settings "2 gpu weak" --num-blocks 2048

echo "=== summary $(date +%T)"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_tp_7b.json" "$OUT_DIR/multi_gpu_tp_7b_dp.json"
