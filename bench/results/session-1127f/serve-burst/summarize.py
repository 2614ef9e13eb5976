"""Per client and tree over every *.txt here: run medians, their median, fix/base, and idle starts whose first step
did not take the whole burst (the warm-up round's included)."""
import ast, glob, re, statistics, sys
from collections import defaultdict

base, fix = sys.argv[1:3] if len(sys.argv) > 2 else ("/work/main", "/work/wt-serve-burst")
runs, starts = defaultdict(list), defaultdict(lambda: [0, 0])
for path in sorted(glob.glob("*.txt")):
    for line in open(path):
        m = re.match(r"tree (\S+) (\w+) n=(\d+): ratio .* median ([\d.]+); first steps (\[.*?\]\])", line)
        if not m:
            continue
        tree, mode, n, med, first = m[1], f"{m[2]} n={m[3]}", int(m[3]), float(m[4]), ast.literal_eval(m[5])
        runs[mode, tree].append(med)
        starts[mode, tree][0] += sum(s[0] != n for s in first)
        starts[mode, tree][1] += len(first)
for mode in sorted({k[0] for k in runs}):
    b, f = runs[mode, base], runs[mode, fix]
    print(f"{mode}: base {len(b)} runs median {statistics.median(b):.3f}, fix {len(f)} runs median "
          f"{statistics.median(f):.3f}, fix/base {statistics.median(f) / statistics.median(b):.3f}; first step short of "
          f"the burst: base {starts[mode, base][0]}/{starts[mode, base][1]}, fix {starts[mode, fix][0]}/{starts[mode, fix][1]}")
