#!/usr/bin/env bash
# Issue 37's GPU check (long contexts, 1.5B-7B, LoRA, fp8 KV), one device call of 5-9 minutes (the pieces' caps add up to 545 s):
#   1. the GPU runs of the kernel tests (split-K decode, fp8 loads and stores, LoRA grouped launches, the runner);
#   2. bench.attention_long: decode attention per layer at the long shapes, the split count the engine picks
#      against the single pass and fixed splits, bf16 and fp8 caches (GB/s of the K/V read);
#   3. bench.engine_throughput rows, each with its decode step against the bandwidth floor (K/V bytes included):
#      1.5B batch 64 1024 + 8192; 7B batch 32 1024 + 4096; 1.5B and 7B 128 + 512 at batch 1 / 64 / 256; LoRA
#      rank 64 at 1.5B batch 64 / 256 (the no-adapter rows are the 1.5B 128 + 512 ones, same call); fp8 KV at
#      1.5B batch 64 1024 + 4096 with the log-prob drift against bf16.
# The call: run  command "bash bench/gpu_long.sh"  kind nvidia-h100-x1  carry [".whl"]  timeout_s 600.
# Each piece has its own timeout (a piece that runs out is named in the summary, the others still run). Logs and
# JSON come back in $OUT/long.tar.gz, the table in $OUT/summary.md. No vLLM here (the peers README has its calls).
set -uo pipefail
OUT=${OUT:-bench/out/gpu_long}
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"
START=$SECONDS


logged_step 110 tests python3 -m pytest -x -q -p no:cacheprovider tests/engine/test_paged_attention.py \
    tests/engine/test_kv_cache_dtype.py tests/engine/test_fused_kernels.py tests/engine/test_fused_linear.py \
    -k "decode or split or prefill or fp8 or store or lora or dora or qkv or gate_up or cache_dtype"
tail -n 3 "$OUT/raw/tests.log" >> "$SUMMARY"
logged_step 55 attention python3 -m bench.attention_long --out "$OUT/raw/attention_long.json"

TP=(python3 -m bench.engine_throughput --skip-hf --warmup-tokens 48)
logged_step 100 long-1.5b "${TP[@]}" --arch qwen2.5-1.5b --batches 64 --prompt-len 1024 --new-tokens 8192 --kv-gib 18 \
    --out "$OUT/raw/long-1.5b.json"
logged_step 90 long-7b "${TP[@]}" --arch qwen2.5-7b --batches 32 --prompt-len 1024 --new-tokens 4096 --kv-gib 12 \
    --out "$OUT/raw/long-7b.json"
logged_step 40 short-1.5b "${TP[@]}" --arch qwen2.5-1.5b --batches 1 64 256 --kv-gib 6 --out "$OUT/raw/short-1.5b.json"
logged_step 50 short-7b "${TP[@]}" --arch qwen2.5-7b --batches 1 64 256 --kv-gib 12 --out "$OUT/raw/short-7b.json"
logged_step 40 lora-1.5b "${TP[@]}" --arch qwen2.5-1.5b --batches 64 256 --lora-rank 64 --kv-gib 6 \
    --out "$OUT/raw/lora-1.5b.json"
logged_step 60 fp8-1.5b "${TP[@]}" --arch qwen2.5-1.5b --batches 64 --prompt-len 1024 --new-tokens 4096 --kv-gib 10 \
    --kv-cache-dtype fp8_e4m3 --logprob-drift --out "$OUT/raw/fp8-1.5b.json"

{
  echo
  echo "| row | batch | tok/s | prefill ms | decode step ms | floor ms | step/floor |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for f in "$OUT"/raw/*.json; do
    python3 - "$f" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if "engine" in r:
    name = f"{r['arch']} {r['prompt_len']}+{r['new_tokens']} lora {r['lora_rank']} kv {r['kv_cache_dtype']}"
    for e in r["engine"]:
        print(f"| {name} | {e['batch']} | {e['engine_tok_s']:.0f} | {e['prefill_s'] * 1e3:.0f} | "
              f"{e['decode_step_ms']:.2f} | {e['floor_ms']:.2f} | {e['step_over_floor']:.2f} |")
    if r.get("logprob_drift"):
        print(f"\nfp8 log-prob drift ({name}): {r['logprob_drift']}\n")
EOF
  done
  echo
  grep -h "splits)" "$OUT/raw/attention.log" 2>/dev/null
} >> "$SUMMARY"
echo "total $((SECONDS - START)) s" >> "$SUMMARY"
tar -czf "$OUT/long.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$SUMMARY"
