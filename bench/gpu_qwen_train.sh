#!/usr/bin/env bash
# Issue 39's runs on one GPU: GRPO on GSM8K with examples/qwen-coder-0.5b-gsm8k.toml (ten minutes of steps, eval of
# the first 500 test problems before and after), one VARIANT per run, the same data and seed:
#   plain       the recipe as it is
#   inference   the seed's inference-aware reward (its weights: latency 0.001/ms, tokens 0.001, kv_mb 0.01, accept
#               1.0, cache_reuse 0.5), whole-step normalisation (train.advantage = "step_norm"), n-gram speculation
#               so that the acceptance term has a signal
#   tandem      tandem rollouts, p = 0.5, the frozen model = a copy of the starting model
#   curriculum  the adaptive curriculum on
# Needs the joined GGUF on the machine: run bench/gpu_qwen_coder.sh's carry calls on the same warm machine first.
# A run longer than the call (BUDGET seconds, default 560) is stopped by SIGTERM, which finishes the step in flight
# and saves a checkpoint: the same call again resumes it (its clock goes on from the checkpoint's total).
# Evidence under $OUT: train-VARIANT.log, VARIANT/{summary.json, metrics.jsonl, config.toml, plots/, report.json}.
#   run(command="bench/gpu_qwen_train.sh plain", kind="nvidia-h100-x1")
# Env: BUDGET, PYTHON (default python3), EXTRA (more `--set` arguments), MEMORY_TRACE=1 (off by default: per-step
# `memory_trace` lines, allocated after the rollout and after the update, peak, the update's largest forward, and
# $OUT/memory_snapshot-VARIANT.pickle of the first 5 steps or up to an out-of-memory error; bench/memory_trace.py).
set -uo pipefail
VARIANT=${1:-}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/out}
GGUF=runs/models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf
RECIPE=examples/qwen-coder-0.5b-gsm8k.toml
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

case $VARIANT in
    plain) sets=() ;;
    inference) sets=(reward.inference.latency=0.001 reward.inference.tokens=0.001 reward.inference.kv_mb=0.01
                     reward.inference.accept=1.0 reward.inference.cache_reuse=0.5 'train.advantage="step_norm"'
                     'rollout.speculative.method="ngram"') ;;
    tandem) sets=(tandem.enabled=true tandem.p=0.5) ;;
    curriculum) sets=(curriculum.enabled=true) ;;
    *) echo "usage: $0 plain|inference|tandem|curriculum"; exit 2 ;;
esac
[[ -f $GGUF ]] || { echo "no $GGUF here: run bench/gpu_qwen_coder.sh's carry calls on this machine first"; exit 3; }
"$PYTHON" -c "import pydantic" 2>/dev/null || "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site runs/wheels/*.whl || exit 1
DATA=runs/data/gsm8k
[[ -f ../shared/data/gsm8k/test.jsonl ]] && DATA=../shared/data/gsm8k

RUN=runs/qwen-coder-$VARIANT
resume=()
[[ -d $RUN/checkpoints ]] && resume=(--resume)
args=(--set "data.path=\"$DATA\"" --set log.tensorboard=false)
for s in "${sets[@]}"; do args+=(--set "$s"); done
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/device.txt"
# shellcheck disable=SC2086  # EXTRA is a list of arguments
entry=(-m tandemrl.cli)
[[ ${MEMORY_TRACE:-0} == 1 ]] && entry=(-m bench.memory_trace --snapshot "$OUT/memory_snapshot-$VARIANT.pickle" --)
timeout -s TERM "${BUDGET:-560}" "$PYTHON" "${entry[@]}" train --config "$RECIPE" --out "$RUN" "${resume[@]}" \
    "${args[@]}" ${EXTRA:-} >> "$OUT/train-$VARIANT.log" 2>&1
echo "train exit status $? (0 = finished; 124 = stopped by the budget: run this call again to resume)"
[[ ${MEMORY_TRACE:-0} == 1 ]] && grep "^memory_trace" "$OUT/train-$VARIANT.log" | head -n 40
grep -vE "it/s\]|━" "$OUT/train-$VARIANT.log" | tail -n 30
mkdir -p "$OUT/$VARIANT"
cp "$RUN"/config.toml "$RUN"/metrics.jsonl "$OUT/$VARIANT/" 2>/dev/null
if [[ -f $RUN/summary.json ]]; then
    cp "$RUN/summary.json" "$OUT/$VARIANT/"
    "$PYTHON" -m tandemrl.cli plot "$RUN" && cp -r "$RUN/plots" "$OUT/$VARIANT/"
    "$PYTHON" -m bench.run_report "$RUN" --out "$OUT/$VARIANT/report.json"
fi
