import json, os, statistics as st
from math import sqrt
from scipy import stats
def acc(mode, seed):
    p = f"/work/stale4/{mode}-{seed}/summary.json"
    return json.load(open(p))["final"]["accuracy"] * 100 if os.path.exists(p) else None
rows = {m: {s: acc(m, s) for s in range(10)} for m in ("base", "sync", "s1", "s4")}
for m, r in rows.items():
    print(f"{m:5}", " ".join(f"{v:5.1f}" if v is not None else "    -" for v in r.values()))
def compare(a, b):
    pairs = [(rows[a][s], rows[b][s]) for s in range(10) if rows[a][s] is not None and rows[b][s] is not None]
    if len(pairs) < 2:
        return
    x, y = [p[0] for p in pairs], [p[1] for p in pairs]
    d = [q - p for p, q in pairs]; m, sd = st.mean(d), st.stdev(d); t = stats.t.ppf(0.975, len(d) - 1)
    print(f"{b} - {a}: n={len(d)} {a} {st.mean(x):.1f} ({st.stdev(x):.1f}) {b} {st.mean(y):.1f} ({st.stdev(y):.1f}) "
          f"paired diff {m:+.1f} ({m - t*sd/sqrt(len(d)):+.1f} to {m + t*sd/sqrt(len(d)):+.1f}) "
          f"welch p {stats.ttest_ind(x, y, equal_var=False).pvalue:.2f}")
compare("sync", "s1"); compare("sync", "s4"); compare("base", "sync"); compare("base", "s4")
