#!/usr/bin/env bash
# Issue 40 point 4, CPU default (800 steps) by seed: `run.sh MODE SEED...`, MODE one of
#   base  sync at the old default train.lr = 1e-3
#   sync  sync at 5e-4;  s1 / s4  rollout.mode = "async", max_staleness 1 / 4, tis_cap 2.0, at 5e-4
# Run from a clone of main at the tree named in done.txt (/work/stale4/tree); the three loops ran side by side.
mode=$1; shift
case $mode in
  base) extra=() ;;
  sync) extra=(--set train.lr=5e-4) ;;
  s1|s4) extra=(--set train.lr=5e-4 --set 'rollout.mode="async"' --set rollout.max_staleness=${mode#s} --set train.tis_cap=2.0) ;;
  *) echo "mode: base, sync, s1 or s4" >&2; exit 2 ;;
esac
cd /work/stale4/tree
for seed in "$@"; do
  out=/work/stale4/$mode-$seed
  [[ -f $out/summary.json ]] && continue
  rm -rf $out
  start=$(date +%s)
  nice -n 19 /work/main/.venv/bin/python -c "import sys, tandemrl, tandemrl.cli; assert tandemrl.__file__.startswith(\"/work/stale4/tree\"); sys.argv[0]=\"tandemrl\"; tandemrl.cli.main()" train --out $out --set train.seed=$seed --set log.tensorboard=false "${extra[@]}" > /work/stale4/$mode-$seed.log 2>&1
  echo "$mode seed $seed exit $? $(( $(date +%s) - start )) s" >> /work/stale4/done.txt
done
