#!/bin/bash
# base (main) vs fix alternating, RUNS runs each, ROUNDS rounds per run; both clients. Usage: ab.sh BASE FIX [RUNS]
cd "$(dirname "$0")"
PY=${PY:-.venv/bin/python} BASE=$1 FIX=$2 RUNS=${3:-3}
for i in $(seq "$RUNS"); do
  for tree in "$BASE" "$FIX"; do
    TREE=$tree timeout 300 $PY burst_sim.py raw 6 64
    TREE=$tree timeout 300 $PY burst_sim.py raw 6 32
    TREE=$tree timeout 300 $PY burst_sim.py httpx 6
  done
done
