#!/usr/bin/env bash
# LoRA / plain decode step, this tree against .ab/base, alternating in one hold (issue 37 point 3): a change to the
# LoRA kernels A/B'd at the step. SIZES="1.5b 7b" (default both), ROUNDS (default 2) pairs per size, the
# adapter-free step once per size. About 30-40 s a run at 1.5B.
# Base: rm -rf .ab && mkdir -p .ab/base && git archive REV tandemrl pyproject.toml $(git ls-files bench | grep -v ^bench/results) | tar -x -C .ab/base
# The call: run  command "OUT=$OUT SIZES=1.5b ROUNDS=1 bash bench/gpu_lora_ab.sh"  carry [".whl", ".ab"].
# Logs and JSON in $OUT/raw.tar.gz, the table in $OUT/summary.md.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_lora_ab}; OUT=$(realpath -m "$OUT")
mkdir -p "$OUT/raw"
source bench/gpu_env.sh
SUMMARY="$OUT/summary.md"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$SUMMARY"
run() {  # run <side> <name> <args...>: bench.engine_throughput from the side's tree
    local side=$1 name=$2; shift 2
    in_side "$side" logged_step 150 "$name" python3 -m bench.engine_throughput --skip-hf --warmup-tokens 48 \
        --batches 64 256 "$@" --out "$OUT/raw/$name.json"
}
for size in ${SIZES:-1.5b 7b}; do
    kv=6; [ "$size" = 7b ] && kv=12
    run new "plain-$size" --arch "qwen2.5-$size" --kv-gib $kv
    for round in $(seq "${ROUNDS:-2}"); do
        for side in base new; do run $side "lora-$size-$side-$round" --arch "qwen2.5-$size" --kv-gib $kv --lora-rank 64; done
    done
done
python3 - "$OUT/raw" <<'PY' | tee -a "$SUMMARY"
import json, sys
from pathlib import Path
raw = Path(sys.argv[1])
print("| run | batch | step ms | / plain | tok/s |\n| --- | --- | --- | --- | --- |")
for f in sorted(raw.glob("lora-*.json")):
    size = f.stem.split("-")[1]
    plain = {r["batch"]: r for r in json.loads((raw / f"plain-{size}.json").read_text())["engine"]}
    for r in json.loads(f.read_text())["engine"]:
        p = plain[r["batch"]]
        print(f"| {f.stem} | {r['batch']} | {r['decode_step_ms']:.2f} | {r['decode_step_ms'] / p['decode_step_ms']:.3f} "
              f"| {r['engine_tok_s']:.0f} |")
PY
tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
