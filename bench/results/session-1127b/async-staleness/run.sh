#!/usr/bin/env bash
# Issue 40 point 4: staleness 4 with the masked correction (and a smaller truncation cap), CPU default, 5 seeds.
cd /work/wt-stale
for spec in sync:0 s4mask:0 s4mask:1 s4mask:2 s4mask:3 s4mask:4 s4cap12:0 s4cap12:1 s4cap12:2 s4cap12:3 s4cap12:4; do
  mode=${spec%%:*}; seed=${spec##*:}
  out=/work/stale2/$mode-$seed
  [[ -f $out/summary.json ]] && continue
  case $mode in
    sync) sets=() ;;
    s4mask) sets=(--set 'rollout.mode="async"' --set rollout.max_staleness=4 --set train.tis_cap=2.0 --set 'train.tis_mode="mask"') ;;
    s4cap12) sets=(--set 'rollout.mode="async"' --set rollout.max_staleness=4 --set train.tis_cap=1.2) ;;
  esac
  rm -rf $out
  start=$(date +%s)
  nice -n 19 /work/main/.venv/bin/python -c "import sys, tandemrl, tandemrl.cli; assert tandemrl.__file__.startswith(\"/work/wt-stale\"); sys.argv[0]=\"tandemrl\"; tandemrl.cli.main()" train --out $out --set train.seed=$seed --set log.tensorboard=false "${sets[@]}" > /work/stale2/$mode-$seed.log 2>&1
  echo "$mode seed $seed exit $? $(( $(date +%s) - start )) s" >> /work/stale2/done.txt
done
