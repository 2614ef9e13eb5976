#!/usr/bin/env bash
# Issue 37 point 2's engine A/B: the linear dispatch (linear_dispatch.grouped_launch_wins: our grouped kernel or cuBLAS
# per op and shape) and the GEMV tile rule (pick_tiles) of this tree against two baseline trees, alternating on one
# GPU: decode throughput of Qwen2.5-0.5B / 1.5B / 7B (random bf16 weights), 128 + 512 tokens, batches 1 / 64 / 256,
# each row with its decode step against the bandwidth floor.
# - .ab/base: main before the rule (972a81a): every op at 1.5B and 7B above 64 rows on cuBLAS, the old GEMV tiles.
# - .ab/prev: the first rule (dd74e72): as this tree but q/k/v grouped above 64 rows up to hidden 2048, which ran
#   the 1.5B batch-256 step at 4.295 ms against base's 3.805 (session-1127). Run twice at 1.5B batch 256, between
#   this tree's run and base's: two samples of each q/k/v kernel there, in alternation.
# Then the GPU runs of the dispatch and linear-kernel tests (the grouped kernels against the modules, the runner's
# grouped path token for token, with and without CUDA graphs), in the time left; then, if time is left, where the
# 1.5B batch-256 step's device time goes in prev and in this tree (bench.profile_engine, top kernels).
# Prepare the baselines here once (ignored by git; they travel as a carried path):
#   rm -rf .ab/base .ab/prev && mkdir -p .ab/base .ab/prev
#   git archive 972a81a tandemrl bench ':(exclude)bench/results' | tar -x -C .ab/base
#   git archive dd74e72 tandemrl bench ':(exclude)bench/results' | tar -x -C .ab/prev
# The call: run  command "bash bench/gpu_linear_dispatch.sh"  kind nvidia-h100-x1  carry [".whl", ".ab"]
# timeout_s 540 (the A/B's caps add up to 390 s, its runs take about 250; the rest is bounded by BUDGET_S, 525).
# Results: $OUT/summary.md (the A/B table, the steps' status, the tests' last line), logs and JSON in $OUT/raw.tar.gz.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_linear_dispatch}
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)  # the trees run from their own folders
source bench/gpu_env.sh
ROOT=$PWD
SUMMARY="$OUT/summary.md"
BUDGET_S=${BUDGET_S:-525}
for tree in base prev; do
  [ -d ".ab/$tree/tandemrl" ] || { echo "no baseline tree in .ab/$tree (see the header)"; exit 2; }
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"

# in_tree <tree> <logged_step's arguments...>: a logged step run from that tree (new: this one), importing its code
in_tree() {
  local tree=$ROOT
  [ "$1" = new ] || tree=$ROOT/.ab/$1
  shift
  (cd "$tree" && export PYTHONPATH=/tmp/site:$tree && logged_step "$@")
}
# side <tree> <arch> <KV GiB> <cap s> <run name> <batches...>: one engine_throughput run of that tree
side() {
  in_tree "$1" "$4" "$2-$5" python3 -m bench.engine_throughput --arch "qwen2.5-$2" --batches "${@:6}" --skip-hf \
      --warmup-tokens 48 --kv-gib "$3" --out "$OUT/raw/$2-$5.json"
}
side base 0.5b 4 45 base 1 64 256; side new 0.5b 4 45 new 1 64 256
side new 1.5b 6 50 new 1 64 256; side prev 1.5b 6 40 prev 256  # the order flips per arch: neither always first
side base 1.5b 6 50 base 1 64 256; side prev 1.5b 6 40 prev2 256
side base 7b 12 60 base 1 64 256; side new 7b 12 60 new 1 64 256

python3 - "$OUT/raw" >> "$SUMMARY" <<'EOF'
import json, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    arch, side = f.stem.split("-")
    for e in json.loads(f.read_text())["engine"]:
        rows.setdefault((arch, e["batch"]), {})[side] = e
tok = lambda e: f"{e['engine_tok_s']:,.0f}" if e else "-"
cell = lambda e: f"{e['decode_step_ms']:.3f} ({e['step_over_floor']:.2f}x)" if e else "-"
ratio = lambda a, b: f"{a['engine_tok_s'] / b:.3f}" if a and b else "-"
print("\n| arch | batch | base tok/s | new tok/s | new / base | prev tok/s (two runs) | new / prev (mean) "
      "| base step ms (/ floor) | new step ms (/ floor) | prev step ms (/ floor) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (arch, batch), s in sorted(rows.items(), key=lambda kv: (float(kv[0][0][:-1]), kv[0][1])):
    b, n, p, p2 = s.get("base"), s.get("new"), s.get("prev"), s.get("prev2")
    prevs = [e for e in (p, p2) if e]
    prev_mean = sum(e["engine_tok_s"] for e in prevs) / len(prevs) if prevs else None
    prev_tok = " / ".join(tok(e) for e in prevs) or "-"
    prev_step = " / ".join(cell(e) for e in prevs) or "-"
    print(f"| {arch} | {batch} | {tok(b)} | {tok(n)} | {ratio(n, b and b['engine_tok_s'])} | {prev_tok} | {ratio(n, prev_mean)} | {cell(b)} "
          f"| {cell(n)} | {prev_step} |")
EOF

left() { echo $(( BUDGET_S - SECONDS )); }
tests_s=$(left); [ "$tests_s" -gt 200 ] && tests_s=200
if [ "$tests_s" -gt 20 ]; then
  logged_step "$tests_s" tests python3 -m pytest -q -p no:cacheprovider tests/engine/test_linear_dispatch.py \
      tests/engine/test_fused_linear.py
  tail -n 1 "$OUT/raw/tests.log" >> "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUT/raw/tests.log" | head -10 >> "$SUMMARY"
else
  echo "- tests: not run, ${tests_s} s left of ${BUDGET_S}" | tee -a "$SUMMARY"
fi

# profile <tree> <cap s>: the 1.5B batch-256 decode's top device kernels in that tree, where time is left
profile() {
  [ "$(left)" -gt "$2" ] || { echo "- profile-$1: not run, $(left) s left" | tee -a "$SUMMARY"; return; }
  in_tree "$1" "$2" "profile-$1" python3 -m bench.profile_engine --arch qwen2.5-1.5b --batch 256 --new-tokens 64
}
profile prev 45; profile new 45
(cd "$OUT" && tar -czf raw.tar.gz raw && rm -rf raw)  # at most 8 files come back: the logs and JSON in one
cat "$SUMMARY"
