#!/usr/bin/env bash
# Issue 37's rows, ours and vLLM 0.20.2's, in one hold on one GPU: 128 + 512 at batch 1 / 64 / 256 (1.5B, 7B), 7B
# batch 32 1024 + 4096 and 1.5B batch 64 1024 + 8192. Random bf16 weights, EOS ignored, tok/s of the whole generate
# call (prefill included). WHAT picks the piece, one device call each:
#   ours        bench.engine_throughput, every row, and prefill of 4096-token prompts at batch 1 and 8 (~6 min)
#   vllm-short  .peers/vllm/bench_vllm.py, the 128 + 512 rows and the 7B long row (~6 min)
#   vllm-long   the 1.5B long row (~3 min; it ran past a call's time beside the others), then vLLM's prefill rows
# The hold (vLLM's wheels ride along in parts and live only while the machine stays warm, ~30 s after a call):
#   here: mkdir -p .peers && cp -r ../shared/peers/vllm .peers/ (ignored), bash .peers/vllm/fetch_wheels.sh, then
#         bash bench/vllm_resplit.sh (50 MiB parts: the kit's 56 no longer fit beside this tree)
#   calls 1-5: bash .peers/vllm/stage_parts.sh NN (00 .. 04) here, then the device call
#         bash .peers/vllm/install_on_device.sh 6   carry [".vparts", ".peers"]   (rc 3: parts still missing)
#   call 6: stage 05, carry [".vparts", ".peers", ".whl"]:
#         bash .peers/vllm/install_on_device.sh 6 && WHAT=ours OUT=$OUT bash bench/gpu_vllm_rows.sh
#   call 7: WHAT=vllm-short OUT=$OUT bash bench/gpu_vllm_rows.sh (carry [".peers"]); call 8: WHAT=vllm-long.
# JSON and logs in $OUT/raw.tar.gz; here, python -m bench.vllm_rows_table FILES... prints the table with the ratios.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_vllm_rows}; mkdir -p "$OUT/raw"; OUT=$(cd "$OUT" && pwd)
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$SUMMARY"
case "${WHAT:?WHAT=ours, vllm-short or vllm-long}" in
ours)
    source bench/gpu_env.sh
    TP=(python3 -m bench.engine_throughput --skip-hf --warmup-tokens 48)
    logged_step 50 ours-1.5b "${TP[@]}" --arch qwen2.5-1.5b --batches 1 64 256 --kv-gib 6 --out "$OUT/raw/ours-1.5b.json"
    logged_step 60 ours-7b "${TP[@]}" --arch qwen2.5-7b --batches 1 64 256 --kv-gib 12 --out "$OUT/raw/ours-7b.json"
    logged_step 90 ours-7b-long "${TP[@]}" --arch qwen2.5-7b --batches 32 --prompt-len 1024 --new-tokens 4096 \
        --kv-gib 12 --out "$OUT/raw/ours-7b-long.json"
    logged_step 110 ours-1.5b-long "${TP[@]}" --arch qwen2.5-1.5b --batches 64 --prompt-len 1024 --new-tokens 8192 \
        --kv-gib 18 --out "$OUT/raw/ours-1.5b-long.json"
    for arch in 1.5b 7b; do  # prefill of 4096-token prompts: the rows' prefill_s
        logged_step 60 "ours-$arch-prefill" "${TP[@]}" --arch "qwen2.5-$arch" --batches 1 8 --prompt-len 4096 \
            --new-tokens 2 --kv-gib 12 --out "$OUT/raw/ours-$arch-prefill.json"
    done
    ;;
vllm-short|vllm-long)
    GPU_SITE_READY=1 source bench/gpu_env.sh  # logged_step only: vLLM's own site, /tmp/vsite
    VLLM=(env PYTHONPATH=/tmp/vsite python3 .peers/vllm/bench_vllm.py)  # its defaults, as in the peers README
    if [ "$WHAT" = vllm-short ]; then
        logged_step 100 vllm-1.5b "${VLLM[@]}" --arch qwen2.5-1.5b --batches 1,64,256 --out "$OUT/raw/vllm-1.5b.jsonl"
        logged_step 130 vllm-7b "${VLLM[@]}" --arch qwen2.5-7b --batches 1,64,256 --out "$OUT/raw/vllm-7b.jsonl"
        logged_step 200 vllm-7b-long "${VLLM[@]}" --arch qwen2.5-7b --batches 32 --prompt-len 1024 --gen-len 4096 \
            --repeats 1 --out "$OUT/raw/vllm-7b-long.jsonl"
    else
        logged_step 280 vllm-1.5b-long "${VLLM[@]}" --arch qwen2.5-1.5b --batches 64 --prompt-len 1024 \
            --gen-len 8192 --repeats 1 --out "$OUT/raw/vllm-1.5b-long.jsonl"
        for arch in 1.5b 7b; do  # prefill of 4096-token prompts: generate one token
            logged_step 120 "vllm-$arch-prefill" "${VLLM[@]}" --arch "qwen2.5-$arch" --batches 1,8 --prompt-len 4096 \
                --gen-len 1 --out "$OUT/raw/vllm-$arch-prefill.jsonl"
        done
    fi
    ;;
*) echo "WHAT=$WHAT: expected ours, vllm-short or vllm-long" >&2; exit 2 ;;
esac
tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$SUMMARY"
