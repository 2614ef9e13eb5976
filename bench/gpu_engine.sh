#!/usr/bin/env bash
# One device call for the engine: its GPU tests, throughput vs HF generate, the GRPO step (logs under $OUT).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 150 python3 -m pytest -q tests/engine -p no:cacheprovider -rf --tb=line > "$OUT/engine_tests.log" 2>&1
grep -E "FAILED|passed|failed" "$OUT/engine_tests.log" | tail -8
timeout 230 python3 -m bench.engine_throughput --kv-gib 4 --out "$OUT/engine_throughput.json" > "$OUT/throughput.log" 2>&1
grep -iE "warn|error|measured|\|" "$OUT/throughput.log" | tail -10
timeout 120 python3 -m bench.grpo_step --backend engine --out "$OUT/grpo_step_engine.json" > "$OUT/grpo.log" 2>&1
tail -3 "$OUT/grpo.log"
