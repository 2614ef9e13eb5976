"""Breakdown of scratch_timeline.py's rounds: where the engine thread is idle (ms from the round's start)."""
import json, statistics, sys


def ms(x):
    return f"{x * 1e3:6.1f}"


def analyze(r, verbose):
    t0, server, client = r["t0"], r["server"], r["client"]
    start = min(c["start"] for c in client)
    end = max(c["end"] for c in client)
    by = {}
    for t, kind, a, b in server:
        by.setdefault(kind, []).append((t, a, b))
    steps = list(zip([t for t, *_ in by["step0"]], [t for t, *_ in by["step1"]], [a for _, a, _ in by["step0"]]))
    busy = sum(e - s for s, e, _ in steps)
    wall = end - start
    reads = [t for t, a, b in by["read"]]
    submits = [t for t, *_ in by["submit"]]
    sent = sorted(c["sent"] for c in client)
    g0, g1 = by["gather0"][0][0], by["gather1"][0][0]
    first_step = steps[0][0]
    last_step_end = steps[-1][1]
    flushes = [t for t, *_ in by["flush"]]
    d0 = [t for t, *_ in by["deliver0"]]
    d1 = [t for t, *_ in by["deliver1"]]
    between = [steps[i + 1][0] - steps[i][1] for i in range(len(steps) - 1)]
    w_done = [t for t, *_ in by.get("w_done", [])]
    w_end = [t for t, *_ in by.get("w_end", [])]
    done_lines = sorted(c["done_line"] for c in client)
    firsts = sorted(c["first"] for c in client)
    row = {
        "wall": wall, "busy": busy, "idle": wall - busy, "steps": len(steps),
        "pre: start->first read": reads[0] - start if reads else 0,
        "pre: first read->last read": max(t for t in reads if t < first_step) - reads[0],
        "pre: last read->last submit": submits[-1] - max(t for t in reads if t < first_step),
        "pre: gather start->first submit": submits[0] - g0 if submits[0] > g0 else 0.0,
        "pre: last submit->gather end": g1 - submits[-1],
        "pre: start->first step": first_step - start,
        "between steps (sum)": sum(between),
        "post: last step end->flush": flushes[-1] - last_step_end,
        "post: flush->deliver": d0[-1] - flushes[-1],
        "post: deliver (64 sinks)": d1[-1] - d0[-1],
        "post: deliver end->last [DONE] write": max(w_done) - d1[-1],
        "post: last [DONE] write->last end write": max(w_end) - max(w_done),
        "post: last end write->client last end": end - max(w_end),
        "post: last step end->round end": end - last_step_end,
    }
    if verbose:
        print(f"  client sent p50 {ms(sent[32] - start)} max {ms(sent[-1] - start)}; first read {ms(reads[0] - start)}"
              f" gather {ms(g0 - start)}..{ms(g1 - start)}; submits {ms(submits[0] - start)}..{ms(submits[-1] - start)}"
              f" (n={len(submits)})")
        for i, (s, e, w) in enumerate(steps):
            f = min((t for t in flushes if t >= e), default=None)
            d = min((t for t in d0 if f and t >= f), default=None)
            dd = min((t for t in d1 if d and t >= d), default=None)
            print(f"  step {i} waiting={w:2d} {ms(s - start)}..{ms(e - start)} ({ms(e - s)})  flush +{ms(f - e)}"
                  f" deliver +{ms(d - f)} for {ms(dd - d)}" + (f"  gap to next {ms(steps[i+1][0] - e)}"
                                                              if i + 1 < len(steps) else ""))
        writes = sorted((t, k) for t, k in ((t, "data") for t, *_ in by.get("w_data", [])))
        # per step: client chunk receipt spread
        print(f"  client first token {ms(firsts[0] - start)}..{ms(firsts[-1] - start)}; [DONE] lines"
              f" {ms(done_lines[0] - start)}..{ms(done_lines[-1] - start)}; ends {ms(min(c['end'] for c in client) - start)}"
              f"..{ms(end - start)}; w_done {ms(min(w_done) - start)}..{ms(max(w_done) - start)}")
        wd = sorted(t for t, *_ in by.get("w_data", []))
        last_deliver = d1[-2] if len(d1) > 1 else None
        # SSE writes after each deliver
        for i, (a, b) in enumerate(zip(d0, d1)):
            nxt = d0[i + 1] if i + 1 < len(d0) else 1e18
            ws = [t for t in wd + w_done if a <= t < nxt]
            if ws:
                print(f"    deliver {i} at {ms(a - start)}: {len(ws)} writes {ms(min(ws) - start)}..{ms(max(ws) - start)}"
                      f" (span {ms(max(ws) - min(ws))}, write cost sum {ms(sum(b for t, p, b in by['w_data'] + by.get('w_done', []) if a <= t < nxt))})")
    return row


def main():
    rows = []
    for path in sys.argv[1:]:
        data = json.load(open(path))
        for i, r in enumerate(data["rounds"]):
            print(f"{path} round {i}: tok/s {r['load']['tok_s']:.0f} ratio {r['load']['tok_s'] / r['in_process_tok_s']:.3f}")
            rows.append(analyze(r, verbose=True))
    print()
    keys = list(rows[0])
    print(f"{'ms':42s}" + "".join(f"{'r' + str(i):>7s}" for i in range(len(rows))) + "  median")
    for k in keys:
        vals = [row[k] for row in rows]
        print(f"{k:42s}" + "".join(ms(v) + " " if k != "steps" else f"{v:6d} " for v in vals)
              + (ms(statistics.median(vals)) if k != "steps" else ""))


if __name__ == "__main__":
    main()
