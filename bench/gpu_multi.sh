#!/usr/bin/env bash
# Issue 36 point 1 in one device call on 2 GPUs (nvidia-h100-x2), under 9 minutes: bench.multi_gpu at Qwen2.5-0.5B
# and 1.5B (random bf16 weights, 8 x 8 x 512 per GPU), 1 gpu plain against 2 gpus strong and weak, each replicated
# (distributed.strategy = "replicate") and sharded ("shard"), plus tandem (frozen copy per rank) replicated at 0.5B;
# one table at the end. Each piece runs under `timeout` (together 470 s: with the wheels' install about 8.5 minutes
# at most); bench.multi_gpu writes its JSON after every row, so a piece cut short keeps the rows it finished.
# Results: $OUT/multi_gpu_*.json (bench/out/ when OUT is unset).
#
#   run(command="bash bench/gpu_multi.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

# weak scaling first (the issue's main number), then strong; ~35-45 s a launch, 5 launches a model
piece 200 0.5b --arch qwen2.5-0.5b --settings "1 gpu plain" "2 gpu weak" "2 gpu strong" \
    --strategies replicate shard
piece 60 0.5b-tandem --arch qwen2.5-0.5b --settings "2 gpu tandem" --strategies replicate
piece 210 1.5b --arch qwen2.5-1.5b --repeats 2 --settings "1 gpu plain" "2 gpu weak" "2 gpu strong" \
    --strategies replicate shard

echo "=== summary $(date +%T)"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_0.5b.json" "$OUT_DIR/multi_gpu_0.5b-tandem.json" \
    "$OUT_DIR/multi_gpu_1.5b.json"
