#!/usr/bin/env bash
# Issue 40 point 4: staleness 4 with sequence-level truncated IS (tis_mode "sequence", cap 2.0), CPU default, seeds in $@.
cd /work/wt-seq
for seed in "$@"; do
  out=/work/stale3/s4seq-$seed
  [[ -f $out/summary.json ]] && continue
  rm -rf $out
  start=$(date +%s)
  nice -n 19 /work/main/.venv/bin/python -c "import sys, tandemrl, tandemrl.cli; assert tandemrl.__file__.startswith(\"/work/wt-seq\"); sys.argv[0]=\"tandemrl\"; tandemrl.cli.main()" train --out $out --set train.seed=$seed --set log.tensorboard=false --set 'rollout.mode="async"' --set rollout.max_staleness=4 --set train.tis_cap=2.0 --set 'train.tis_mode="sequence"' > /work/stale3/s4seq-$seed.log 2>&1
  echo "s4seq seed $seed exit $? $(( $(date +%s) - start )) s" >> /work/stale3/done.txt
done
