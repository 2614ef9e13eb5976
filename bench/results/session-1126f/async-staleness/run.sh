#!/usr/bin/env bash
# Issue 40 point 4: the CPU default (800 steps) at 3 seeds per mode; summary.json per run.
cd /work/main
for seed in 0 1 2 3 4; do
  for mode in sync s1tis s4tis s1; do
    out=/work/stale/$mode-$seed
    [[ -f $out/summary.json ]] && continue
    case $mode in
      sync) sets=() ;;
      s1) sets=(--set 'rollout.mode="async"' --set rollout.max_staleness=1) ;;
      s1tis) sets=(--set 'rollout.mode="async"' --set rollout.max_staleness=1 --set train.tis_cap=2.0) ;;
      s4tis) sets=(--set 'rollout.mode="async"' --set rollout.max_staleness=4 --set train.tis_cap=2.0) ;;
    esac
    rm -rf $out
    start=$(date +%s)
    nice -n 19 .venv/bin/tandemrl train --out $out --set train.seed=$seed --set log.tensorboard=false "${sets[@]}" > /work/stale/$mode-$seed.log 2>&1
    echo "$mode seed $seed exit $? $(( $(date +%s) - start )) s" >> /work/stale/done.txt
  done
done
