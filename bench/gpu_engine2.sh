#!/usr/bin/env bash
# Engine numbers with the host-side fixes and compile off (default).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 230 python3 -m bench.engine_throughput --kv-gib 4 --out "$OUT/engine_throughput.json" > "$OUT/throughput.log" 2>&1
grep -iE "warn|error|measured|\|" "$OUT/throughput.log" | tail -10
timeout 120 python3 -m bench.grpo_step --backend engine --out "$OUT/grpo_step_engine.json" > "$OUT/grpo.log" 2>&1
tail -1 "$OUT/grpo.log"
timeout 120 python3 -m bench.grpo_step --backend engine --micro-batch 16 --gradient-checkpointing --out "$OUT/grpo_step_engine_mb16_gc.json" > "$OUT/grpo2.log" 2>&1
tail -1 "$OUT/grpo2.log"
