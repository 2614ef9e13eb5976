#!/usr/bin/env bash
# Issue 36 point 5 on 2 GPUs (NCCL): the CPU tests of a dying and of a hanging rank, run where `device = "auto"`
# picks CUDA and `distributed.backend = "auto"` picks NCCL. Each test asserts the job ends naming the rank with the
# last checkpoint intact; the hanging one also that it ends far below the collective timeout. Durations per test
# (the whole test: start-up, two good steps, the fault, and for the dying rank the resume) in the pytest report.
#
#   run(command="bash bench/gpu_failure.sh", kind="nvidia-h100-x2", carry=[".whl"])   about 3 minutes
set -u -o pipefail
cd "$(dirname "$0")/.."
source bench/gpu_multi_env.sh
echo "=== failure paths on NCCL $(date +%T)"
timeout --kill-after=15 300 python3 -m pytest -q -p no:cacheprovider --durations=0 -rs \
    tests/distributed/test_torchrun.py -k "dying or hanging" 2>&1 | tail -n 15
