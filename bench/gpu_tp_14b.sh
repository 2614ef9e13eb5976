#!/usr/bin/env bash
# Issue 41's 4-GPU number in one device call (nvidia-h100-x4), under 8 minutes: a Qwen2.5-14B-architecture full
# fine-tune GRPO step (FSDP2 over 4 GPUs, gradient checkpointing, random bf16 weights, 4 prompts x 8 x (128 + 512)
# per rank) with one tensor-parallel engine over the 4 ranks (engine.tensor_parallel_size = 4: 10 heads, 2 KV heads
# and a quarter of the MLP and the vocabulary per rank) and a KV cache of 8192 blocks of 16 tokens per rank (the
# global batch's 128 x 640 tokens need 5120). Peak memory per GPU, step time, refresh time.
# Results: $OUT/multi_gpu_tp_14b.json.
#
#   run(command="bash bench/gpu_tp_14b.sh", kind="nvidia-h100-x4", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
LAUNCH_TIMEOUT=380
source bench/gpu_multi_env.sh

piece 400 tp_14b --arch qwen2.5-14b --gradient-checkpointing --prompts 4 --repeats 2 --strategies shard \
    --settings "4 gpu tp" --num-blocks 8192

echo "=== summary $(date +%T)"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_tp_14b.json"
