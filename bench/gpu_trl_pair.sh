#!/usr/bin/env bash
# Issue 38 point 4 in one hold on a two-GPU machine: TRL + vLLM colocated on GPU 0 (0.5B, then 1.5B) while ours runs
# the same realistic step on GPU 1 (bench/gpu_realistic_ours.sh), so both sides share one machine and one hold.
# Needs the TRL kit installed on this machine first (bench/peers/trl_vllm/README.md: its parts ride along with
# earlier calls of the same hold). About 6 minutes (TRL 2.5 + 3.5 min; ours 5 min beside it).
# The call: run  command "bash bench/peers/trl_vllm/install_on_device.sh && bash bench/gpu_trl_pair.sh"
#           kind nvidia-h100-x2  carry [".whl", ".tvparts"] (the last part)  timeout_s 480.
# Returns $OUT/trl_vllm_MODEL.json and .log for both models, ours' summary.md and ours.tar.gz.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_trl_pair}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
( export CUDA_VISIBLE_DEVICES=0 OUT
  bash bench/peers/trl_vllm/run_on_device.sh qwen2.5-0.5b 4
  bash bench/peers/trl_vllm/run_on_device.sh qwen2.5-1.5b 2 ) > "$OUT/trl.out" 2>&1 &
TRL=$!
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/ours" bash bench/gpu_realistic_ours.sh
cp "$OUT/ours/summary.md" "$OUT/summary.md"
tar -czf "$OUT/ours.tar.gz" -C "$OUT" ours && rm -rf "$OUT/ours"
wait $TRL
echo "TRL exit status $?"
cat "$OUT/trl.out"
