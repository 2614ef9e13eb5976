#!/usr/bin/env bash
# On the GPU machine, once install_on_device.sh has installed the kit into /tmp/tvsite: one TRL + vLLM colocated
# measurement (a warm-up step and one timed step); the JSON and the full log go to $OUT, the JSON line ends the output.
#   bash bench/peers/trl_vllm/run_on_device.sh qwen2.5-0.5b 4      # model, rows per forward (--micro-batch)
set -euo pipefail
MODEL=${1:?usage: run_on_device.sh MODEL [MICRO_BATCH] [more trl_grpo_step flags]}
MICRO=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
DEST=${OUT:-bench/out}
mkdir -p "$DEST"
# The kit (vLLM, TRL, pydantic and the rest) replaces bench/gpu_env.sh's .whl: the part calls leave no room to carry it.
# vLLM 0.26's sampler imports FlashInfer (not in the kit) unless told not to; its own top-k/top-p sampler runs instead.
export VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONPATH=/tmp/tvsite:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
python3 -m bench.peers.trl_vllm.trl_grpo_step --model "$MODEL" --micro-batch "$MICRO" \
  --out "$DEST/trl_vllm_$MODEL.json" "$@" > "$DEST/trl_vllm_$MODEL.log" 2>&1 || { tail -60 "$DEST/trl_vllm_$MODEL.log"; exit 1; }
grep -E "Using FlashAttention|flash_attn|CUDA graph|KV cache|Maximum concurrency" "$DEST/trl_vllm_$MODEL.log" | tail -8 || true
grep '^{"peer"' "$DEST/trl_vllm_$MODEL.log"
