#!/usr/bin/env bash
# One device call for the engine's numbers: decode breakdown, throughput vs HF generate, the GRPO step (logs under
# $OUT). GPU tests: `python3 -m pytest -q tests/engine` (about 3 minutes on an H100), in a call of their own.
source bench/gpu_env.sh
timeout 120 python3 -m bench.decode_breakdown --out "$OUT/decode_breakdown.json" > "$OUT/breakdown.log" 2>&1
grep -E "^batch" "$OUT/breakdown.log"
timeout 300 python3 -m bench.engine_throughput --kv-gib 4 --out "$OUT/engine_throughput.json" > "$OUT/throughput.log" 2>&1
grep -iE "error|measured|\|" "$OUT/throughput.log" | tail -10
timeout 150 python3 -m bench.grpo_step --backend engine --out "$OUT/grpo_step_engine.json" > "$OUT/grpo.log" 2>&1
tail -3 "$OUT/grpo.log"
