#!/usr/bin/env bash
# Issue 41: where the tensor-parallel decode step's time goes, in one device call of about 3 minutes. bench.tp_decode
# --profile at Qwen2.5-7B (random bf16 weights) on 2 GPUs: torch.profiler over 32 decode steps at batch 1 and 64
# (prompt 128), the whole model on GPU 0 alone, then rank 0 of the tensor-parallel engine over both GPUs; per decode
# step: device time by category, kernels, kernel sum / busy / idle against the wall time, the top 15 kernels and
# the largest idle gaps (bench/tp_profile.py). Prints the tables.
# Results: $OUT/tp_profile/tp_profile_rank{0,1}.json and gzipped chrome traces (chrome://tracing, Perfetto).
#
#   run(command="bash bench/gpu_tp_profile.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh

tp_decode 230 tp_profile --shapes 1:128:33 64:128:33 --profile-steps 32 --kv-gib 8 --profile "$OUT_DIR/tp_profile"
ls -la "$OUT_DIR/tp_profile"
