#!/usr/bin/env bash
# Issue 36 point 1 on 4 GPUs in one device call (nvidia-h100-x4), under 9 minutes: bench.multi_gpu at Qwen2.5-0.5B
# and 1.5B (random bf16 weights, 8 x 8 x 512 per GPU), 1 gpu plain against 4 gpus weak (each rank the 1-gpu batch;
# target >= 3.5x) and strong (the 1-gpu batch split four ways), replicated (distributed.strategy = "replicate"),
# then 4 gpu weak sharded at 0.5B for comparison; one table at the end. Each piece runs under `timeout` (together
# 490 s: with the wheels' install under 9 minutes); bench.multi_gpu writes its JSON after every row, so a piece cut
# short keeps the rows it finished. Results: $OUT/multi_gpu_4gpu-*.json (bench/out/ when OUT is unset).
#
#   run(command="bash bench/gpu_multi4.sh", kind="nvidia-h100-x4", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

# weak scaling first (the issue's number), then strong; ~35-50 s a launch
piece 160 4gpu-0.5b --arch qwen2.5-0.5b --settings "1 gpu plain" "4 gpu weak" "4 gpu strong" --strategies replicate
piece 210 4gpu-1.5b --arch qwen2.5-1.5b --repeats 2 --settings "1 gpu plain" "4 gpu weak" "4 gpu strong" \
    --strategies replicate
piece 120 4gpu-0.5b-shard --arch qwen2.5-0.5b --settings "4 gpu weak" --strategies shard

echo "=== summary $(date +%T)"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_4gpu-0.5b.json" "$OUT_DIR/multi_gpu_4gpu-1.5b.json" \
    "$OUT_DIR/multi_gpu_4gpu-0.5b-shard.json"
