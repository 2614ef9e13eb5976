#!/usr/bin/env bash
# Issue 36 points 3, 4 and point 1's profile in one device call on 2 GPUs (nvidia-h100-x2), under 9 minutes:
#   1. NCCL weight sync (bench.nccl_sync): this process the trainer on cuda:0, a `tandemrl serve` on cuda:1; a full
#      bucketed push at Qwen2.5-0.5B, 1.5B and 7B (random bf16 weights): push time (targets 0.5B <= 0.15 s,
#      7B <= 1.0 s), the trainer's extra memory (one bucket), the served weights' checksum = the trainer's;
#   2. tandem with the frozen model on the second GPU: tests/engine/test_tandem_placement.py (its cuda:1 cases run
#      here), then bench.tandem_step --frozen-device cuda:1 (Qwen3-0.6B, 8 x 8 x 512, vanilla vs tandem p = 0.5 in
#      one run; target step <= 1.15x vanilla);
#   3. the overlap of gradient communication with compute: bench.multi_gpu --profile, 2 gpu weak at 0.5B,
#      replicated and sharded (rank 0's update: NCCL kernel time and the share of it beside compute kernels).
# Each piece runs under `timeout` (together 490 s: with the wheels' install under 9 minutes) and writes its JSON as
# it goes; a summary at the end. Results: $OUT/nccl_sync.json, tandem_cuda1.json, multi_gpu_profile.json,
# profiles/*.json.gz, *.log (bench/out/ when OUT is unset).
#
#   run(command="bash bench/gpu_multi2.sh", kind="nvidia-h100-x2", carry=[".whl"])
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh
nvidia-smi topo -m | head -4

echo "=== nccl sync (at most 220 s) $(date +%T)"
timeout --kill-after=15 220 python3 -m bench.nccl_sync --out "$OUT_DIR/nccl_sync.json" 2>&1 | quiet \
    || echo "=== nccl sync: exit status ${PIPESTATUS[0]}"

echo "=== tandem placement tests (at most 60 s) $(date +%T)"
timeout --kill-after=10 60 python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_tandem_placement.py \
    > "$OUT_DIR/tandem_placement_tests.log" 2>&1
echo "tests exit status $?"; tail -n 3 "$OUT_DIR/tandem_placement_tests.log"

echo "=== tandem, frozen model on cuda:1 (at most 90 s) $(date +%T)"
timeout --kill-after=10 90 python3 -m bench.tandem_step --frozen-device cuda:1 --ps 0.5 --repeats 3 \
    --out "$OUT_DIR/tandem_cuda1.json" > "$OUT_DIR/tandem_cuda1.log" 2>&1
echo "bench exit status $?"; tail -n 4 "$OUT_DIR/tandem_cuda1.log"

LAUNCH_TIMEOUT=58 piece 120 profile --arch qwen2.5-0.5b --settings "2 gpu weak" --strategies replicate shard \
    --repeats 2 --profile "$OUT_DIR/profiles"

echo "=== summary $(date +%T)"
[ -f "$OUT_DIR/nccl_sync.json" ] && python3 -m bench.nccl_sync --print "$OUT_DIR/nccl_sync.json"
python3 - "$OUT_DIR/tandem_cuda1.json" <<'EOF'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
if not path.is_file():
    sys.exit(f"no result in {path}")
result = json.loads(path.read_text())
vanilla = result["rows"]["vanilla"]["step_s"]
print(f"| tandem, frozen on {result['frozen_device']} ({result['arch']}, {result['shape']}) | step s | / vanilla "
      "(target <= 1.15) |\n|---|---|---|")
for name, row in result["rows"].items():
    print(f"| {name} | {row['step_s']:.2f} | {row['step_s'] / vanilla:.2f} |")
EOF
python3 -m bench.multi_gpu --summarize "$OUT_DIR/multi_gpu_profile.json"
