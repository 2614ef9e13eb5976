#!/usr/bin/env bash
# Issue 36 point 3 and point 1's profile in one device call on 2 GPUs (nvidia-h100-x2), under 9 minutes:
#   1. NCCL weight sync (bench.nccl_sync): this process the trainer on cuda:0, a `tandemrl serve` on cuda:1; a full
#      bucketed push at Qwen2.5-0.5B, 1.5B and 7B (random bf16 weights): push time (targets 0.5B <= 0.15 s,
#      7B <= 1.0 s), the trainer's extra memory (one bucket), the served weights' checksum = the trainer's;
#   2. the overlap of gradient communication with compute: bench.multi_gpu --profile, 2 gpu weak at 0.5B,
#      replicated and sharded (rank 0's update: NCCL kernel time and the share of it beside compute kernels; each
#      launch gets 150 s: writing the trace took a 58 s limit past its end).
# Each piece runs under `timeout` (together 540 s) and writes its JSON as it goes; a summary at the end. Results:
# $OUT/nccl_sync.json, multi_gpu_profile.json, profiles/*.json.gz (bench/out/ when OUT is unset). Tandem across the
# two GPUs (point 4) is bench/gpu_tandem2.sh.
#
#   run(command="bash bench/gpu_multi2.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh
nvidia-smi topo -m | head -4

echo "=== nccl sync (at most 220 s) $(date +%T)"
timeout --kill-after=15 220 python3 -m bench.nccl_sync --out "$OUT_DIR/nccl_sync.json" 2>&1 | quiet \
    || echo "=== nccl sync: exit status ${PIPESTATUS[0]}"

LAUNCH_TIMEOUT=150 piece 320 profile --arch qwen2.5-0.5b --settings "2 gpu weak" --strategies replicate shard \
    --repeats 2 --profile "$OUT_DIR/profiles"

echo "=== summary $(date +%T)"
[ -f "$OUT_DIR/nccl_sync.json" ] && python3 -m bench.nccl_sync --print "$OUT_DIR/nccl_sync.json"
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_profile.json"
