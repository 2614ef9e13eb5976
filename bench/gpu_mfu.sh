#!/usr/bin/env bash
# Issue 38's training update on the GPU, eager against model.compile (regional compilation of the decoder layers,
# tandemrl/models/compile.py, and the log-prob head's reductions, tandemrl/train/head_logprobs.py), one device call
# of at most 570 s:
#   0. tests/train/test_head_logprobs.py, its GPU test included (compiled head reductions against eager, bf16);
#   1. the realistic step at Qwen2.5-1.5B (32 x 8, lognormal median 600, cap 4096, 16384-token micro-batches, one
#      timed step after a warm-up step) with varlen attention, compiled. The warm-up update pays the cold compile
#      (cold update s); the timed step after it does not;
#   2. the GRPO step 8 x 8 x 512 at Qwen2.5-0.5B (engine rollouts, micro-batches of 8 rows) with sdpa: compiled,
#      then eager;
#   3. the realistic step eager, last, with all the time left (it ran past a 150 s limit before).
# The compiled runs log graph breaks and recompiles (TORCH_LOGS); their counts are in the summary.
# flex_attention is left out: its own compile ran past 290 s on an H100 (bench/RESULTS.md).
# Estimate: tests 40 s; realistic compiled 180 s; GRPO compiled 70 s, eager 50 s; realistic eager 150 s.
# The call: run  command "bash bench/gpu_mfu.sh"  kind nvidia-h100-x1  carry [".whl"]  timeout_s 600.
# The table comes back in $OUT/summary.md, logs and JSON in $OUT/mfu.tar.gz.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_mfu}
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$SUMMARY"
START=$SECONDS

compile_logs() {  # graph breaks and recompiles in a compiled run's log
    local log="$OUT/raw/$1.log"
    echo "  - $1: graph breaks logged $(grep -c 'Graph break' "$log"), recompiles $(grep -c 'Recompiling function' \
        "$log")" >> "$SUMMARY"
}
logged_step 120 head-logprobs-tests python3 -m pytest -q -p no:cacheprovider tests/train/test_head_logprobs.py
export TORCH_LOGS_FORMAT="%(message)s"
REALISTIC=(python3 -m bench.realistic_step --model qwen2.5-1.5b --repeats 1 --attn varlen)
TORCH_LOGS=graph_breaks,recompiles logged_step 240 realistic-1.5b-varlen-compile "${REALISTIC[@]}" --compile \
    --out "$OUT/raw/realistic-1.5b-varlen-compile.json"
compile_logs realistic-1.5b-varlen-compile
GRPO=(python3 -m bench.grpo_step --backend engine --repeats 3 --attn sdpa)
TORCH_LOGS=graph_breaks,recompiles logged_step 100 grpo-0.5b-sdpa-compile "${GRPO[@]}" --compile \
    --out "$OUT/raw/grpo-0.5b-sdpa-compile.json"
compile_logs grpo-0.5b-sdpa-compile
logged_step 75 grpo-0.5b-sdpa "${GRPO[@]}" --out "$OUT/raw/grpo-0.5b-sdpa.json"
LEFT=$((565 - (SECONDS - START)))  # timeout 0 would mean no limit: at least 1 s
logged_step $((LEFT > 1 ? LEFT : 1)) realistic-1.5b-varlen "${REALISTIC[@]}" --out "$OUT/raw/realistic-1.5b-varlen.json"

{
  echo
  echo "| row | attention | compiled | cold update s | step s | rollout s | update s | update MFU | micro-batches | peak GiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for f in "$OUT"/raw/*.json; do
    python3 - "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if "median" in r:  # bench.realistic_step
    m = r["median"]
    print(f"| realistic {r['model']} | {r['attn_implementation']} | {r['compile']} | {r['cold_update_s']:.1f} | "
          f"{m['step_s']:.2f} | {m['rollout_s']:.2f} | {m['update_s']:.2f} | {m['update_mfu']:.1%} | "
          f"{m['micro_batches']} | {m['peak_gib']:.1f} |")
else:  # bench.grpo_step: train s is the update with the backend's sleep and wake
    print(f"| grpo {r['arch']} {r['prompts']}x{r['group']}x{r['new_tokens']} | {r['attn_implementation']} | "
          f"{r['compile']} | {r['cold_train_s']:.1f} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | "
          f"{r['train_s']:.2f} (train) | - | - | {r['peak_gib']:.1f} |")
PY
  done
} >> "$SUMMARY"
echo "total $((SECONDS - START)) s" >> "$SUMMARY"
tar -czf "$OUT/mfu.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$SUMMARY"
