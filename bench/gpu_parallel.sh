#!/usr/bin/env bash
# Several device jobs at once, each on its own GPUs of one machine: a 4-GPU hold does in one call what would take
# several calls in turn. Each argument is one job, "GPUS|NAME|SECONDS|COMMAND": COMMAND runs under bash with
# CUDA_VISIBLE_DEVICES=GPUS and OUT=$OUT/NAME, cut at SECONDS; its output goes to $OUT/NAME/job.log. Jobs that share
# a GPU run one after another inside one COMMAND (`a; b`). At the end each job's folder is packed into
# $OUT/NAME.tar.gz and $OUT/jobs.md lists every job's exit status, seconds and summary.md (at most 7 jobs: a call
# returns 8 files). The carried wheels (.whl) are installed once, before the jobs, so they do not race on /tmp/site.
#   bash bench/gpu_parallel.sh "0,1|tp|480|bash bench/gpu_tp_fused.sh" "2|lora|420|bash bench/gpu_lora.sh"
set -uo pipefail
[ $# -ge 1 ] && [ $# -le 7 ] || { echo "usage: gpu_parallel.sh 'GPUS|NAME|SECONDS|COMMAND' ... (1 to 7 jobs)"; exit 2; }
OUT=${OUT:-bench/out/gpu_parallel}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source bench/gpu_env.sh
export GPU_SITE_READY=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/jobs.md"
NAMES=()
for job in "$@"; do
    IFS='|' read -r gpus name seconds command <<< "$job"
    mkdir -p "$OUT/$name"
    NAMES+=("$name")
    ( t0=$SECONDS
      CUDA_VISIBLE_DEVICES=$gpus OUT="$OUT/$name" timeout --kill-after=20 "$seconds" bash -c "$command" \
          > "$OUT/$name/job.log" 2>&1
      status=$?
      echo "- $name (GPU $gpus): exit status $status$([ $status = 124 ] && echo ' (TIMED OUT)'), $((SECONDS - t0)) s" \
          > "$OUT/$name.status" ) &
    echo "started $name on GPU $gpus (at most $seconds s): $command"
done
wait
for name in "${NAMES[@]}"; do
    cat "$OUT/$name.status" >> "$OUT/jobs.md" && rm -f "$OUT/$name.status"
done
for name in "${NAMES[@]}"; do
    { echo; echo "## $name"; cat "$OUT/$name/summary.md" 2>/dev/null || tail -n 15 "$OUT/$name/job.log"; } >> "$OUT/jobs.md"
    tar -czf "$OUT/$name.tar.gz" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
done
cat "$OUT/jobs.md"
