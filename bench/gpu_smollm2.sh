#!/usr/bin/env bash
# Issue 17's run on one GPU: SmolLM2-135M-Instruct from its GGUF, GRPO with examples/smollm2-$TASK.toml (TASK =
# arith or gsm8k), evidence under $OUT (train log, summary.json, metrics.jsonl, plots, report.json from
# bench.run_report). Calls on one warm machine (parts and the run directory live in ignored paths there):
#   1. carry [".carry/gguf/1"]          bench/gpu_smollm2.sh            # stores part 1 (exit 3: a part is missing)
#   2. carry [".carry/gguf/2", ".whl"]  bench/gpu_smollm2.sh arith      # joins + checks sha256, trains
#   3. (only if 2 ran out of time)      bench/gpu_smollm2.sh arith      # resumes from the checkpoint SIGTERM saved
# `bench/gguf_parts.sh split runs/models/SmolLM2-135M-Instruct.Q4_1.gguf` makes .carry/gguf/{1,2} first (here).
# Env: BUDGET (seconds before SIGTERM, default 540), PYTHON (default python3), EXTRA (more `--set` arguments),
# NAME (the run's name, default TASK: runs/smollm2-NAME, train-NAME.log; e.g. arith-tandem beside the plain arith).
set -uo pipefail
TASK=${1:-}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/out}
GGUF=runs/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_TARGET=/tmp/site PYTHON
parts=()
for dir in .carry/gguf/1 .carry/gguf/2; do [[ -d $dir ]] && parts+=("$dir"); done
if (( ${#parts[@]} )) || [[ ! -f $GGUF ]]; then
    bench/gguf_parts.sh join runs/models "${parts[@]}" || exit $?
fi
[[ -n $TASK ]] || exit 0
[[ -f examples/smollm2-$TASK.toml ]] || { echo "no examples/smollm2-$TASK.toml (TASK = arith or gsm8k)"; exit 2; }
NAME=${NAME:-$TASK}
RUN=runs/smollm2-$NAME
resume=()
[[ -d $RUN/checkpoints ]] && resume=(--resume)
# SIGTERM before the call's limit: the step in flight finishes, a checkpoint is saved, the next call resumes.
# shellcheck disable=SC2086  # EXTRA is a list of arguments
timeout -s TERM "${BUDGET:-540}" "$PYTHON" -m tandemrl.cli train --config "examples/smollm2-$TASK.toml" --out "$RUN" \
    "${resume[@]}" --set log.tensorboard=false ${EXTRA:-} > "$OUT/train-$NAME.log" 2>&1
echo "train exit status $? (0 = finished, 124/130 = stopped by the time budget: run this call again to resume)"
grep -vE "it/s\]|━" "$OUT/train-$NAME.log" | tail -n 25
cp "$RUN"/config.toml "$RUN"/metrics.jsonl "$OUT"/ 2>/dev/null
if [[ -f $RUN/summary.json ]]; then
    cp "$RUN/summary.json" "$OUT/"
    "$PYTHON" -m tandemrl.cli plot "$RUN" && cp -r "$RUN/plots" "$OUT/"
    "$PYTHON" -m bench.run_report "$RUN" --out "$OUT/report.json"
fi
