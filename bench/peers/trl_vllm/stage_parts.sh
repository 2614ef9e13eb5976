#!/usr/bin/env bash
# Here, from the repo root: puts the named parts of .trlvllm/parts into .tvparts/ for the next device call (carry
# [".tvparts"]) and checks that the carried tree stays within the 64 MiB a call may carry. ALSO=.whl counts a
# second carried path too (a part that rides along with one of our GPU benchmarks).
#   bash bench/peers/trl_vllm/stage_parts.sh 00        then 01, then 02 03 (see README.md)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: stage_parts.sh NN [NN...]"; exit 2; }
rm -rf .tvparts && mkdir -p .tvparts
for d in .trlvllm .tvparts; do
  git check-ignore -q "$d" || { echo "$d/ is not git-ignored: add '/$d/' to .git/info/exclude"; exit 1; }
done
for n in "$@"; do cp ".trlvllm/parts/part$n" .tvparts/; done
cp .trlvllm/parts/tar.sha256 .trlvllm/parts/NPARTS .tvparts/
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null \
        | awk '{s+=$1} END {print s+0}')
parts=$(du -cb .tvparts ${ALSO:-} | tail -1 | cut -f1)
awk -v t="$tree" -v p="$parts" -v a="${ALSO:-}" 'BEGIN { printf ".tvparts %s%.1f MiB + working tree %.1f MiB = %.1f of 64 MiB\n",
  a == "" ? "" : "+ " a " ", p / 1048576, t / 1048576, (t + p) / 1048576; exit (t + p > 64 * 1048576) }' || { echo "TOO BIG: stage fewer parts"; exit 1; }
