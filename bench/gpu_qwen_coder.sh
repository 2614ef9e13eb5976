#!/usr/bin/env bash
# Issue 39's checks on one GPU with Qwen2.5-Coder-0.5B-Instruct from its GGUF: the engine's greedy tokens against HF
# generate on 16 GSM8K prompts (float32), then the baseline: greedy accuracy on the first 500 GSM8K test problems
# with examples/qwen-coder-0.5b-gsm8k.toml's prompt (chat template, its system prompt) and the `accuracy` reward's
# extraction, with a 95 % Wilson interval. Evidence under $OUT: parity.json/.log, baseline.json/.log.
#
# Here first: bench/qwen_coder_gguf.sh fetch && bench/qwen_coder_gguf.sh carry   (.carry/qwen-coder/1 ... 9)
# Then 9 calls on one warm machine (it stays warm only briefly after a call: make them back to back), K = 1 ... 9:
#   carry [".carry/qwen-coder/K"]   command: bench/gpu_qwen_coder.sh
# Each call stores what it carries in ignored paths there (runs/models: the part; runs/wheels: pydantic & co for
# tandemrl, from part 2; runs/data/gsm8k: GSM8K, from part 1) and exits 3 while parts are missing; the call that
# completes the set joins the file, checks the pinned sha256 and runs the checks (about 5 minutes). A later call
# without carry runs the checks again. CHECKS=0 stops after the join (for a training call that follows).
# Env: PYTHON (default python3), PARITY_PROMPTS (16), NEW_TOKENS (256, the parity), BASELINE_LIMIT (500).
set -uo pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/out}
CARRY=.carry/qwen-coder
GGUF=runs/models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf
RECIPE=examples/qwen-coder-0.5b-gsm8k.toml
mkdir -p "$OUT" runs/models runs/wheels runs/data/gsm8k
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_TARGET=/tmp/site PYTHON

parts=()
for dir in "$CARRY"/*/; do
    [[ -d $dir ]] || continue
    dir=${dir%/}
    parts+=("$dir")
    if [[ -d $dir/wheels ]]; then cp -f "$dir"/wheels/*.whl runs/wheels/; fi
    for gz in "$dir"/gsm8k/*.jsonl.gz; do
        [[ -f $gz ]] && gunzip -c "$gz" > "runs/data/gsm8k/$(basename "$gz" .gz)"
    done
done
if (( ${#parts[@]} )); then
    bench/gguf_parts.sh join runs/models "${parts[@]}" || exit $?
elif [[ ! -f $GGUF ]]; then
    echo "no $GGUF and no part carried: carry .carry/qwen-coder/K (bench/qwen_coder_gguf.sh carry makes them)"
    exit 3
fi
bench/qwen_coder_gguf.sh verify "$GGUF" || exit 2
[[ ${CHECKS:-1} == 0 ]] && exit 0

if ! "$PYTHON" -c "import pydantic" 2>/dev/null; then
    if ! compgen -G "runs/wheels/*.whl" > /dev/null; then
        echo "no pydantic and no wheels carried (part 2 brings them)"; exit 2
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        runs/wheels/*.whl || exit 1
fi
DATA=runs/data/gsm8k
[[ -f ../shared/data/gsm8k/test.jsonl ]] && DATA=../shared/data/gsm8k
[[ -f $DATA/test.jsonl ]] || { echo "no GSM8K test.jsonl (part 1 brings it)"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"

# 1. engine == HF generate, greedy, float32 (bf16 kernels may flip near-ties; the issue asks for token equality)
timeout 240 "$PYTHON" -m bench.greedy_parity --config "$RECIPE" --data "$DATA" --prompts "${PARITY_PROMPTS:-16}" \
    --new-tokens "${NEW_TOKENS:-256}" --json "$OUT/parity.json" > "$OUT/parity.log" 2>&1
echo "parity exit status $? (0 = every prompt identical)"
grep -vE "it/s\]|━" "$OUT/parity.log" | tail -n 22

# 2. the baseline: the recipe's own evaluation (bf16, the engine, greedy, max_tokens 512) on the first 500 problems
timeout 300 "$PYTHON" -m tandemrl.cli eval --config "$RECIPE" --set "data.path=\"$DATA\"" \
    --set "eval.limit=${BASELINE_LIMIT:-500}" --set eval.pass_k=0 --json > "$OUT/baseline.json" 2> "$OUT/baseline.log"
echo "baseline exit status $?"
grep -vE "it/s\]|━" "$OUT/baseline.log" | tail -n 8
"$PYTHON" - "$OUT/baseline.json" <<'PY'
import json, sys
from bench.run_report import accuracy_interval
path = sys.argv[1]
lines = open(path).read().strip().splitlines()
if not lines:
    sys.exit(f"no result in {path}: see baseline.log")
result = json.loads(lines[-1])
result["interval"] = accuracy_interval(result["accuracy"], result["num_prompts"])
open(path, "w").write(json.dumps(result, indent=1))
low, high = result["interval"]["ci95"]
print(f"baseline: accuracy {result['accuracy']:.3f} on {result['num_prompts']} problems, 95 % Wilson "
      f"[{low:.3f}, {high:.3f}], mean response {result['response_length']:.0f} tokens")
PY
