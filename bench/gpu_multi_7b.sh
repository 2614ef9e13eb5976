#!/usr/bin/env bash
# Issue 36 point 2 in one device call on 2 GPUs (nvidia-h100-x2), under 9 minutes: a Qwen2.5-7B-architecture GRPO
# step (random bf16 weights, gradient checkpointing, 4 x 8 x 512 per GPU): full fine-tune over 2 GPUs sharded
# (FSDP2 + the engine's replica; replicated does not fit 80 GB with AdamW), LoRA (rank 16, every linear layer) on
# 1 GPU and replicated on 2. Peak memory per GPU, step time, the gather's time. Results: $OUT/multi_gpu_7b*.json.
#
#   run(command="bash bench/gpu_multi_7b.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
LAUNCH_TIMEOUT=240
source bench/gpu_multi_env.sh
SHAPE=(--arch qwen2.5-7b --gradient-checkpointing --prompts 4 --repeats 2 --num-blocks 2048)

piece 250 7b-full "${SHAPE[@]}" --settings "2 gpu weak" --strategies shard
piece 250 7b-lora "${SHAPE[@]}" --lora --settings "1 gpu plain" "2 gpu weak" --strategies replicate

echo "=== summary $(date +%T)"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_7b-full.json" "$OUT_DIR/multi_gpu_7b-lora.json"
