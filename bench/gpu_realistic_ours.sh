#!/usr/bin/env bash
# Issue 38's realistic step, ours, for the one-hold comparison with TRL + vLLM colocated: run it on the same warm
# machine right after the peer's calls (bench/peers/trl_vllm/README.md, calls 1-4), so both sides share one GPU.
#   0.5B and 1.5B, 32 prompts x 8, lognormal median 600, cap 4096, varlen attention, model.compile, one timed step
#   after a warm-up step (which pays the compile); 0.5B also times the padded update on the same batch (the waste).
# The call: run  command "bash bench/gpu_realistic_ours.sh"  kind nvidia-h100-x1  carry [".whl"]  timeout_s 420.
# Estimate: 0.5B 130 s, 1.5B 160 s. The table comes back in $OUT/summary.md, JSON and logs beside it.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_realistic_ours}
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$SUMMARY"
RUN=(python3 -m bench.realistic_step --repeats 1 --attn varlen --compile)
logged_step 200 realistic-0.5b "${RUN[@]}" --model qwen2.5-0.5b --padded-too --out "$OUT/raw/realistic-0.5b.json"
logged_step 200 realistic-1.5b "${RUN[@]}" --model qwen2.5-1.5b --out "$OUT/raw/realistic-1.5b.json"
{
  echo
  echo "| model | step s | rollout s | rollout tail s | update s | update MFU | peak GiB | padded update s (waste) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for f in "$OUT"/raw/*.json; do
    python3 - "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["median"]
padded = m.get("padded_update_s")
print(f"| {r['model']} | {m['step_s']:.2f} | {m['rollout_s']:.2f} | {m.get('rollout_tail_s', float('nan')):.2f} | "
      f"{m['update_s']:.2f} | {m['update_mfu']:.1%} | {m['peak_gib']:.1f} | "
      f"{'-' if padded is None else f'{padded:.2f}'} ({r['padding_waste']:.0%}) |")
PY
  done
} >> "$SUMMARY"
cat "$SUMMARY"
