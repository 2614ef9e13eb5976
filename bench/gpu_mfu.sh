#!/usr/bin/env bash
# Issue 38's training update on the GPU, attention by attention, one device call of about 8.5 minutes:
#   1. the varlen GPU test: torch's varlen_attn against the per-sequence sdpa reference in bf16, forward and backward;
#   2. the GRPO step 8 x 8 x 512 at Qwen2.5-0.5B (engine rollouts, micro-batches of 8 rows): sdpa, whose dense mask
#      keeps these equal-length rows padded, then varlen, which packs them;
#   3. the realistic step at Qwen2.5-1.5B (32 x 8, lognormal median 600, cap 4096, 16384-token micro-batches, one
#      timed step after a warm-up): varlen, then flex_attention (its first update compiles, about 235 s cold on an
#      H100; last, with what is left of the call, so a cut leaves the other rows), recompiles logged.
# Estimate from bench/RESULTS.md: test 40 s, GRPO steps 2 x 45 s, realistic varlen 90 s, flex 90 s + 235 s compile.
# The first update's compilations (bench.flex_recompiles) are measured already (RESULTS.md, "The training update's
# compilations at 1.5B"): not repeated here.
# The call: run  command "bash bench/gpu_mfu.sh"  kind nvidia-h100-x1  carry [".whl"]  timeout_s 600.
# The table comes back in $OUT/summary.md, logs and JSON in $OUT/mfu.tar.gz.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_mfu}
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"
python3 -c "import torch, inspect; from torch.nn.attention.varlen import varlen_attn as f; \
print('torch', torch.__version__, 'varlen_attn', inspect.signature(f))" 2>&1 | tee -a "$SUMMARY"
START=$SECONDS

logged_step 90 varlen-test python3 -m pytest -q -p no:cacheprovider -rs tests/models/test_varlen_attention.py
tail -n 3 "$OUT/raw/varlen-test.log" >> "$SUMMARY"
for attn in sdpa varlen; do
    logged_step 90 "grpo-0.5b-$attn" python3 -m bench.grpo_step --backend engine --repeats 3 --attn "$attn" \
        --out "$OUT/raw/grpo-0.5b-$attn.json"
done
REALISTIC=(python3 -m bench.realistic_step --model qwen2.5-1.5b --repeats 1)
logged_step 150 realistic-1.5b-varlen "${REALISTIC[@]}" --attn varlen --out "$OUT/raw/realistic-1.5b-varlen.json"
TORCH_LOGS=recompiles logged_step $((575 - (SECONDS - START))) realistic-1.5b-flex "${REALISTIC[@]}" \
    --attn flex_attention --out "$OUT/raw/realistic-1.5b-flex.json"
echo "recompiles logged in the flex realistic step: $(grep -c 'Recompiling function' \
    "$OUT/raw/realistic-1.5b-flex.log")" >> "$SUMMARY"

{
  echo
  echo "| row | attention | step s | rollout s | update s | update MFU | micro-batches | peak GiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for f in "$OUT"/raw/*.json; do
    python3 - "$f" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if "median" in r:  # bench.realistic_step
    m = r["median"]
    print(f"| realistic {r['model']} | {r['attn_implementation']} | {m['step_s']:.2f} | {m['rollout_s']:.2f} | "
          f"{m['update_s']:.2f} | {m['update_mfu']:.1%} | {m['micro_batches']} | {m['peak_gib']:.1f} |")
else:  # bench.grpo_step: train s is the update with the backend's sleep and wake
    print(f"| grpo {r['arch']} {r['prompts']}x{r['group']}x{r['new_tokens']} | {r['attn_implementation']} | "
          f"{r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['train_s']:.2f} (train) | - | - | {r['peak_gib']:.1f} |")
EOF
  done
} >> "$SUMMARY"
echo "total $((SECONDS - START)) s" >> "$SUMMARY"
tar -czf "$OUT/mfu.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$SUMMARY"
