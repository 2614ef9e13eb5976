#!/usr/bin/env bash
# Issue 36's strong scaling where decode is no longer the whole story, in one device call (nvidia-h100-x2), about
# 8 minutes: 1 gpu plain against 2 gpu strong (the same global batch, each rank half the prompts), replicated, at
# Qwen2.5-0.5B and 1.5B with 32 prompts x 8 x (128 + 512) a step (256 sequences: the 8-prompt shape's rollout is
# bound by reading the weights, so halving the batch leaves it as long; see bench/RESULTS.md). Measured on 2 x H100
# (fourth session): 0.5B at 64 prompts, 1 GPU: 10.41 s a step (rollout 2.20 / update 8.21), ~10x the 8-prompt update:
# each launch needs its time (a 1.5B 1-GPU launch at 64 prompts ran past 130 s).
#
#   run(command="bash bench/gpu_strong.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

LAUNCH_TIMEOUT=110 piece 230 strong-0.5b --arch qwen2.5-0.5b --prompts 32 --num-blocks 12000 --repeats 2 \
    --settings "1 gpu plain" "2 gpu strong" --strategies replicate
LAUNCH_TIMEOUT=150 piece 310 strong-1.5b --arch qwen2.5-1.5b --prompts 32 --num-blocks 12000 --repeats 1 \
    --settings "1 gpu plain" "2 gpu strong" --strategies replicate

echo "=== summary $(date +%T)"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_strong-0.5b.json" "$OUT_DIR/multi_gpu_strong-1.5b.json"
