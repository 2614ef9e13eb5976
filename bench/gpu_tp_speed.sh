#!/usr/bin/env bash
# Issue 41, decode only, on 2 GPUs in one device call, under 5 minutes: bench.tp_decode at Qwen2.5-7B (random bf16
# weights), batch 1 at 128 + 512 tokens, batch 64 at 128 + 512 and 1024 + 4096: the tensor-parallel engine's decode
# step over both GPUs with each all-reduce kind (engine.tp_all_reduce = nccl, then symmetric: PyTorch symmetric
# memory, multicast off) against the whole model on one GPU (one baseline, same launch), CUDA graphs on; greedy parity
# with the teacher-forced logit noise of each kind. If that launch fails (not cut short), an eager run of the
# symmetric kind at batch 1 says whether its captured all-reduces are why.
# Results: $OUT/tp_speed.json (bench/out/ when OUT is unset); the table and parity lines at the end of the output.
#
#   run(command="bash bench/gpu_tp_speed.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

tp_decode 250 tp_speed --shapes 1:128:512 64:128:512 64:1024:4096 --all-reduce nccl symmetric
status=$?
if [ "$status" != 0 ] && [ "$status" != 124 ]; then
    tp_decode 40 tp_speed_eager --eager --shapes 1:128:128 --all-reduce symmetric --parity-prompts 4
fi
echo "=== done $(date +%T)"
