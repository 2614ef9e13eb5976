import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["rounds"]:
        s = r["server"]
        cpu = [(e[0], e[3]) for e in s if e[1] in ("cpu", "asgi")]
        heads = sorted(e[0] for e in s if e[1] == "w_head")
        bodies = sorted(e[0] for e in s if e[1] == "body")
        a = [x for x in cpu if x[0] >= bodies[0]]
        (t0, c0), (t1, c1) = a[0], max(cpu)
        print(f"{path}: first body -> last head: wall {1e3*(t1-t0):.1f} ms, event-loop CPU {1e3*(c1-c0):.1f} ms"
              f" ({(c1-c0)/(t1-t0):.0%}); per request {1e3*(t1-t0)/64:.2f} ms wall")
