#!/usr/bin/env bash
# One device call for the trainer issue: GPU tests, the GRPO-step baseline, a bf16 run of the loop.
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout 240 python3 -m pytest -q -x tests/train tests/backends -p no:cacheprovider 2>&1 | tail -5
python3 bench/grpo_step.py --out "$OUT/grpo_step.json"
python3 bench/grpo_step.py --gradient-checkpointing --out "$OUT/grpo_step_gc.json"
python3 -m tandemrl.cli train --out /tmp/gpu_run --set model.device=cuda --set train.max_steps=30 \
  --set log.tensorboard=false 2>&1 | grep -E "^step (1|10|20|30)/|accuracy" | tail -8
cp /tmp/gpu_run/summary.json "$OUT/tiny_gpu_summary.json"
