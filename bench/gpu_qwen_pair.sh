#!/usr/bin/env bash
# Issue 39: two of bench/gpu_qwen_train.sh's variants at once on a 2-GPU machine, one per GPU (same data, seed and
# budget; each run sees only its own GPU). Same resume rule: a run stopped by the call's BUDGET resumes when the
# same call is made again. Needs the joined GGUF: bench/gpu_qwen_coder.sh's carry calls on this machine first.
#   run(command="bench/gpu_qwen_pair.sh plain inference", kind="nvidia-h100-x2")
# Env: as bench/gpu_qwen_train.sh (BUDGET, EXTRA, PYTHON).
set -uo pipefail
[[ $# == 2 ]] || { echo "usage: $0 VARIANT_ON_GPU0 VARIANT_ON_GPU1"; exit 2; }
PYTHON=${PYTHON:-python3}
export PYTHONPATH=/tmp/site:$PWD
# one install before the two runs start (each would otherwise install into /tmp/site at the same time)
"$PYTHON" -c "import pydantic" 2>/dev/null || "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site runs/wheels/*.whl || exit 1
CUDA_VISIBLE_DEVICES=0 bench/gpu_qwen_train.sh "$1" > "runs/pair-$1.txt" 2>&1 &
first=$!
CUDA_VISIBLE_DEVICES=1 bench/gpu_qwen_train.sh "$2" > "runs/pair-$2.txt" 2>&1
wait $first
for variant in "$1" "$2"; do echo "=== $variant"; tail -n 12 "runs/pair-$variant.txt"; done
