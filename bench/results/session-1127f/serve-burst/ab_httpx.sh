#!/bin/bash
# bench.serve's client only, ABBA order (base fix fix base ...), PAIRS pairs. Usage: ab_httpx.sh BASE FIX [PAIRS]
cd "$(dirname "$0")"
PY=${PY:-.venv/bin/python} BASE=$1 FIX=$2 PAIRS=${3:-4}
for i in $(seq "$PAIRS"); do
  if (( i % 2 )); then order="$BASE $FIX"; else order="$FIX $BASE"; fi
  for tree in $order; do TREE=$tree timeout 300 $PY burst_sim.py httpx 6; done
done
