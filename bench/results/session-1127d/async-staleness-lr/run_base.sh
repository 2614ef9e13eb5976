#!/usr/bin/env bash
# Issue 40 point 4: sync against staleness 4 (tis_cap 2.0) at the default learning rate (sync only: "base"), seeds in $@.
# Run from a clone of main at the tree named in done.txt.
cd /work/stale4/tree
for seed in "$@"; do
  for mode in base; do
    out=/work/stale4/$mode-$seed
    [[ -f $out/summary.json ]] && continue
    rm -rf $out
    extra=()
    [[ $mode == s4 ]] && extra=(--set 'rollout.mode="async"' --set rollout.max_staleness=4 --set train.tis_cap=2.0)
    start=$(date +%s)
    nice -n 19 /work/main/.venv/bin/python -c "import sys, tandemrl, tandemrl.cli; assert tandemrl.__file__.startswith(\"/work/stale4/tree\"); sys.argv[0]=\"tandemrl\"; tandemrl.cli.main()" train --out $out --set train.seed=$seed --set log.tensorboard=false "${extra[@]}" > /work/stale4/$mode-$seed.log 2>&1
    echo "$mode seed $seed exit $? $(( $(date +%s) - start )) s" >> /work/stale4/done.txt
  done
done
