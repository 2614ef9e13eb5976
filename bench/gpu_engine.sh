#!/usr/bin/env bash
# One device call for the engine issue: GPU tests of the engine, throughput vs HF generate, the GRPO step.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 240 python3 -m pytest -q tests/engine -p no:cacheprovider 2>&1 | grep -E "passed|failed|Error|error" | tail -15
timeout 200 python3 -m bench.engine_throughput --kv-gib 4 --out "$OUT/engine_throughput.json" 2>&1 | tail -12
timeout 120 python3 -m bench.grpo_step --backend engine --out "$OUT/grpo_step_engine.json" 2>&1 | tail -2
timeout 120 python3 -m bench.grpo_step --backend engine --micro-batch 16 --out "$OUT/grpo_step_engine_mb16.json" 2>&1 | tail -1
