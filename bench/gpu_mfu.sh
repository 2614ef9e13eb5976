#!/usr/bin/env bash
# Issue 38's MFU suspects on the GPU: (1) compilations over micro-batch lengths in the training update, then the
# realistic 1.5B step (update MFU) with recompiles logged. Run: bash bench/gpu_mfu.sh (nvidia-h100-x1, carry .whl).
source bench/gpu_env.sh
set -x
TORCH_LOGS=recompiles python -m bench.flex_recompiles --model qwen2.5-1.5b --rows 64 --max-completion 2048 \
    --budget 16384 --updates 4 > "$OUT/flex_recompiles.txt" 2>&1
grep "^update" "$OUT/flex_recompiles.txt"
TORCH_LOGS=recompiles python -m bench.realistic_step --model qwen2.5-1.5b --out "$OUT/realistic_step_1.5b.json" \
    > "$OUT/realistic_step_1.5b.txt" 2>&1
tail -4 "$OUT/realistic_step_1.5b.txt"
echo "recompiles logged during the realistic step: $(grep -c 'Recompiling function' "$OUT/realistic_step_1.5b.txt")"
