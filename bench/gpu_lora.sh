#!/usr/bin/env bash
# Issue 37 point 3's GPU check (LoRA decode against the adapter-free step), two device calls: PART=tests (the
# kernel and runner tests, about 6 minutes on a cold Triton cache: 74 tests, 200 s covered 60 of them) and
# PART=bench (the rest, about 4 minutes); the default runs both, which needs more than one call's 600 s.
#   1. the GPU runs of the LoRA kernel tests (the split shrink, the expand, the grouped launches and the cuBLAS +
#      shrink + expand route against peft, the runner's greedy output against the merged model on both routes, with
#      and without CUDA graphs) and the dispatch rule's;
#   2. bench.engine_throughput at 1.5B and 7B, batch 64 and 256, 128 + 512, without and with --lora-rank 64 (the
#      LoRA / plain decode step ratio per row in the summary);
#   3. bench.lora_profile with PDL off (TANDEMRL_PDL=0: each kernel's own device time, no early-launch waits
#      counted): per-kernel device time of one decode step, plain vs LoRA, 1.5B at batch 64 and 256.
# PART=sweep instead: bench.lora_shrink_sweep's split policies on both routes at 1.5B and 7B, about 4 minutes.
# The calls: run  command "PART=tests bash bench/gpu_lora.sh"  kind nvidia-h100-x1  carry [".whl"]  timeout_s 600,
# then the same with PART=bench.
# Each piece has its own timeout (named in the summary if it runs out). Logs and JSON in $OUT/lora.tar.gz, the
# tables in $OUT/summary.md.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_lora}
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"
START=$SECONDS
PART=${PART:-all}

[[ $PART == bench || $PART == sweep ]] || logged_step 540 tests python3 -m pytest -q -p no:cacheprovider tests/engine/test_lora_shrink.py \
    tests/engine/test_lora_expand.py tests/engine/test_linear_dispatch.py tests/engine/test_fused_linear.py \
    tests/engine/test_model_runner.py -k "lora or dora or shrink or slabs or rule or expand"
[[ $PART == bench || $PART == sweep ]] || { grep -E "^(FAILED|ERROR)" "$OUT/raw/tests.log"; tail -n 1 "$OUT/raw/tests.log"; } >> "$SUMMARY"
if [ "$PART" = tests ]; then
  tar -czf "$OUT/lora.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
  cat "$SUMMARY"
  exit 0
fi

if [ "$PART" = sweep ]; then  # the shrink's split policies on both routes at both models' shapes (~2 min each)
  logged_step 240 sweep-1.5b python3 -m bench.lora_shrink_sweep --arch qwen2.5-1.5b --rows 64 256 \
      --out "$OUT/raw/sweep-1.5b.json"
  logged_step 240 sweep-7b python3 -m bench.lora_shrink_sweep --arch qwen2.5-7b --rows 64 256 \
      --out "$OUT/raw/sweep-7b.json"
  python3 -m bench.lora_shrink_sweep --pick "$OUT"/raw/sweep-*.json | tee -a "$SUMMARY"
  tar -czf "$OUT/lora.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
  exit 0
fi
TP=(python3 -m bench.engine_throughput --skip-hf --warmup-tokens 48 --batches 64 256)
logged_step 90 plain-1.5b "${TP[@]}" --arch qwen2.5-1.5b --kv-gib 6 --out "$OUT/raw/plain-1.5b.json"
logged_step 90 lora-1.5b "${TP[@]}" --arch qwen2.5-1.5b --kv-gib 6 --lora-rank 64 --out "$OUT/raw/lora-1.5b.json"
logged_step 90 plain-7b "${TP[@]}" --arch qwen2.5-7b --kv-gib 12 --out "$OUT/raw/plain-7b.json"
logged_step 120 lora-7b "${TP[@]}" --arch qwen2.5-7b --kv-gib 12 --lora-rank 64 --out "$OUT/raw/lora-7b.json"
TANDEMRL_PDL=0 logged_step 45 profile-1.5b-64 python3 -m bench.lora_profile --arch qwen2.5-1.5b --batch 64 \
    --out "$OUT/raw/profile-1.5b-64.json"
# PDL off: a kernel launched early would count its wait for the one before it as its own device time
TANDEMRL_PDL=0 logged_step 45 profile-1.5b-256 python3 -m bench.lora_profile --arch qwen2.5-1.5b --batch 256 \
    --rows 16 --out "$OUT/raw/profile-1.5b-256.json"

{
  echo
  echo "| arch | batch | plain step ms | LoRA step ms | LoRA / plain | plain tok/s | LoRA tok/s |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  python3 - "$OUT/raw" <<'EOF'
import json, sys
from pathlib import Path
raw = Path(sys.argv[1])
for arch in ("1.5b", "7b"):
    try:
        plain, lora = (json.loads((raw / f"{kind}-{arch}.json").read_text()) for kind in ("plain", "lora"))
    except FileNotFoundError as missing:
        print(f"| {arch} | missing: {missing.filename} | | | | | |")
        continue
    for p, q in zip(plain["engine"], lora["engine"]):
        print(f"| {arch} | {p['batch']} | {p['decode_step_ms']:.2f} | {q['decode_step_ms']:.2f} | "
              f"{q['decode_step_ms'] / p['decode_step_ms']:.2f} | {p['engine_tok_s']:.0f} | {q['engine_tok_s']:.0f} |")
EOF
  for name in profile-1.5b-64 profile-1.5b-256; do
    echo
    sed -n '/^qwen/,$p' "$OUT/raw/$name.log" 2>/dev/null
  done
} >> "$SUMMARY"
echo "total $((SECONDS - START)) s" >> "$SUMMARY"
tar -czf "$OUT/lora.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$SUMMARY"
