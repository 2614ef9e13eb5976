#!/usr/bin/env bash
# Issue 39 point 3: n-gram speculative decoding's acceptance and speed-up on real text, on one GPU, after a training
# run on the same warm machine (bench/gpu_qwen_train.sh plain leaves runs/qwen-coder-plain there):
#   run(command="bench/gpu_ngram_real.sh runs/qwen-coder-plain", kind="nvidia-h100-x1")
# For each model of MODELS (final: the run's last checkpoint; start: the recipe's starting model, the GGUF), the
# run's first PROMPTS training prompts decoded plainly and with n-gram speculation (k = 2 and 4), at T = 1.0 (the
# training temperature) and greedy, in the run's dtype; then, greedy only, in float32 (FP32=0: skipped), where a
# difference between plain and n-gram tokens cannot be a bf16 near-tie and so is a bug.
# Evidence under $OUT/ngram: MODEL.json / MODEL.log, MODEL-fp32.json / .log (bench/ngram_real.py's table and JSON).
# Env: PYTHON (default python3), MODELS ("final"), PROMPTS (128), BATCH (64), FP32 (1), EXTRA (more arguments).
set -uo pipefail
RUN=${1:?usage: $0 RUN_DIR   (a finished run on this machine, e.g. runs/qwen-coder-plain)}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/out}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

[[ -f $RUN/config.toml ]] || { echo "no $RUN/config.toml: train first (bench/gpu_qwen_train.sh plain)"; exit 3; }
"$PYTHON" -c "import pydantic" 2>/dev/null || "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site runs/wheels/*.whl || exit 1
mkdir -p "$OUT/ngram"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/ngram/device.txt"
status=0
for model in ${MODELS:-final}; do
    common=(--run "$RUN" --model "$model" --prompts "${PROMPTS:-128}" --batch "${BATCH:-64}")
    # shellcheck disable=SC2086  # EXTRA is a list of arguments
    "$PYTHON" -m bench.ngram_real "${common[@]}" --out "$OUT/ngram/$model.json" ${EXTRA:-} \
        > "$OUT/ngram/$model.log" 2>&1 || status=$?
    grep -vE "it/s\]|━|Loading" "$OUT/ngram/$model.log" | tail -n 14
    if [[ ${FP32:-1} == 1 ]]; then
        # shellcheck disable=SC2086
        "$PYTHON" -m bench.ngram_real "${common[@]}" --temperature 0 --set 'model.dtype="float32"' \
            --out "$OUT/ngram/$model-fp32.json" ${EXTRA:-} > "$OUT/ngram/$model-fp32.log" 2>&1 || status=$?
        grep -vE "it/s\]|━|Loading" "$OUT/ngram/$model-fp32.log" | tail -n 8
    fi
done
exit $status
