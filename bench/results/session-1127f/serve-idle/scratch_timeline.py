"""Timeline of kept-alive rounds of gather_sim (the real app + EngineLoop + uvicorn over the sleeping SimEngine),
instrumented by wrappers only (tandemrl untouched). Both processes stamp time.perf_counter() (CLOCK_MONOTONIC).

python scratch_timeline.py serve PORT         (child)
python scratch_timeline.py run ROUNDS [OUT]   (parent)
"""
from pathlib import Path
import asyncio, json, os, sys, time

ROOT = str(Path(__file__).resolve().parents[4])  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "session-1127e" / "gather-sim"))
import gather_sim as sim  # noqa: E402

T = time.perf_counter


# ------------------------------------------------------------------------------------------ server side

def _patch_reads(rec):
    """The event loop's socket reads."""
    from uvicorn.protocols.http import h11_impl
    orig_dr = h11_impl.H11Protocol.data_received

    def data_received(self, data):
        rec((T(), "read", self.client[1] if self.client else 0, len(data)))
        return orig_dr(self, data)
    h11_impl.H11Protocol.data_received = data_received


def _patch_engine_loop(rec, prof, profile_end):
    """submit, gather, flush, delivery on the event loop, and the fake engine's steps."""
    import cProfile
    import tandemrl.serve.engine_loop as el
    from tandemrl.serve.engine_loop import EngineLoop
    orig_submit, orig_gather, orig_flush = EngineLoop.submit, EngineLoop._gather, EngineLoop._flush

    def submit(self, requests, sink, stream=True):
        rec((T(), "submit", len(requests), 0))
        return orig_submit(self, requests, sink, stream)

    def gather(self):
        rec((T(), "gather0", 0, 0))
        try:
            return orig_gather(self)
        finally:
            rec((T(), "gather1", 0, 0))

    def flush(self):
        rec((T(), "flush", sum(len(e) for _, e in self._outbox.values()), 0))
        return orig_flush(self)
    EngineLoop.submit, EngineLoop._gather, EngineLoop._flush = submit, gather, flush
    orig_deliver = el._deliver

    def deliver(batch):
        if prof[0] is not None and not prof[1]:
            prof[0].disable(); prof[1] = True
        if profile_end and prof[0] is None and any(isinstance(e, el.Finished) for _, evs in batch for e in evs):
            prof[0] = cProfile.Profile(); prof[0].enable()
        rec((T(), "deliver0", len(batch), time.thread_time()))
        orig_deliver(batch)
        rec((T(), "deliver1", len(batch), 0))
    el._deliver = deliver
    orig_engine_step = sim.SimEngine.step

    def engine_step(self):
        rec((T(), "step0", len(self.waiting), len(self.running)))
        try:
            return orig_engine_step(self)
        finally:
            rec((T(), "step1", 0, 0))
    sim.SimEngine.step = engine_step


def _timeline_route(app, ev, prof, profile_end):
    """GET /_timeline: the events so far (cleared), and the profile (if any) to /tmp/tl_prof.txt."""
    import io, pstats
    from starlette.responses import JSONResponse

    async def dump(request):
        if profile_end and prof[0] is not None:
            prof[0].disable(); prof[1] = True
        if prof[0] is not None and prof[1]:
            buf = io.StringIO(); pstats.Stats(prof[0], stream=buf).sort_stats("tottime").print_stats(45)
            buf2 = io.StringIO(); pstats.Stats(prof[0], stream=buf2).sort_stats("cumulative").print_stats(70)
            open("/tmp/tl_prof.txt", "w").write(buf.getvalue() + buf2.getvalue())
        prof[0], prof[1] = None, False
        out = list(ev)
        ev.clear()
        return JSONResponse(out)
    app.add_route("/_timeline", dump, methods=["GET"])


def _traced(app, rec, prof, profile):
    """The completions requests' ASGI receipt, whole bodies, and every response write."""
    import cProfile

    async def traced(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            return await app(scope, receive, send)
        port_ = scope["client"][1]
        rec((T(), "asgi", port_, time.thread_time()))
        if profile and prof[0] is None:
            prof[0] = cProfile.Profile(); prof[0].enable()

        async def recv():
            m = await receive()
            if m["type"] == "http.request" and not m.get("more_body"):
                rec((T(), "body", port_, 0))
            return m

        async def snd(m):
            t0 = T()
            await send(m)
            if m["type"] == "http.response.start":
                kind = "w_head"
                rec((T(), "cpu", port_, time.thread_time()))
            else:
                b = m.get("body", b"")
                kind = "w_done" if b.endswith(b"[DONE]\n\n") else ("w_end" if not m.get("more_body") else "w_data")
            rec((t0, kind, port_, T() - t0))
        await app(scope, recv, snd)
    return traced


def serve(port):
    import uvicorn
    import tandemrl.serve.engine_loop as el
    from tandemrl.serve.app import build_app
    from tandemrl.serve.engine_loop import EngineLoop
    from tandemrl.serve.server import SWITCH_INTERVAL_S, freeze_startup_heap
    from tandemrl.serve.state import Arrivals, ServerState
    import torch, transformers  # noqa: F401

    ev = []  # (t, kind, a, b)
    profile, profile_end = os.environ.get("PROFILE") == "1", os.environ.get("PROFILE") == "end"
    prof = [None, False]  # the cProfile.Profile, whether it stopped
    _patch_reads(ev.append)
    _patch_engine_loop(ev.append, prof, profile_end)
    if os.environ.get("QUIET_S"):
        el.GATHER_QUIET_S = float(os.environ["QUIET_S"])
    arrivals = Arrivals()
    loop = EngineLoop(sim.SimEngine(), arriving=lambda: arrivals.count)
    state = ServerState(loop=loop, tokenizer=sim.Tok(), model_name="bench", max_model_len=4096, vocab_size=1000,
                        arrivals=arrivals)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = build_app(state)
    _timeline_route(app, ev, prof, profile_end)
    traced = _traced(app, ev.append, prof, profile)
    freeze_startup_heap()
    loop.start()
    uvicorn.run(traced, host="127.0.0.1", port=port, log_level="warning", lifespan="off", loop="asyncio", http="h11")


# ------------------------------------------------------------------------------------------ client side

CLIENT = []


async def one_client(http, prompt, new_tokens):
    """bench.serve.one_client's work, with absolute stamps (same requests, same parsing)."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 1.0, "stream": True,
            "ignore_eos": True, "return_token_ids": True}
    start = T()
    first, tokens, sent, done_line = None, 0, 0.0, None
    chunks = []

    async def trace(event, info):
        nonlocal sent
        if event == "http11.send_request_body.complete":
            sent = T()

    async with http.stream("POST", "/v1/completions", json=body, extensions={"trace": trace}) as response:
        headers = T()
        response.raise_for_status()
        port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done_line = T()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ids = json.loads(line[6:])["choices"][0].get("token_ids", [])
            if ids:
                chunks.append(T())
            if ids and first is None:
                first = T()
            tokens += len(ids)
    end = T()
    CLIENT.append({"port": port, "start": start, "sent": sent, "headers": headers, "first": first,
                   "done_line": done_line, "end": end, "chunks": chunks})
    return {"latency": end - start, "ttft": first - start, "headers": headers - start, "tokens": tokens,
            "sent": sent - start}


async def rounds(url, count):
    sys.path.insert(0, os.environ.get("TREE", ROOT))
    import httpx
    import bench.serve as bs
    bs.one_client = one_client
    prompts = [[5 + i] * 128 for i in range(64)]
    out = []
    async with bs.open_client(url, 64) as http:
        await bs.load_test(http, prompts, sim.NEW)
        async with httpx.AsyncClient(base_url=url) as side:
            await side.get("/_timeline")
        for _ in range(count):
            CLIENT.clear()
            t0 = T()
            r = await bs.load_test(http, prompts, sim.NEW)
            t1 = T()
            async with httpx.AsyncClient(base_url=url) as side:
                server = (await side.get("/_timeline")).json()
            out.append({"t0": t0, "t1": t1, "load": r, "client": list(CLIENT), "server": server})
    return out


def run(count, out_path):
    tree = os.environ.get("TREE", ROOT)
    with sim.serving_child(__file__, tree) as port:
        results = asyncio.run(rounds(f"http://127.0.0.1:{port}", count))
    base = sim.in_process()
    for r in results:
        r["in_process_tok_s"] = base
    with open(out_path, "w") as f:
        json.dump({"tree": tree, "rounds": results}, f)
    print(f"tree {tree}: in-process {base:.0f}; rounds " + " ".join(f"{r['load']['tok_s']:.0f}" for r in results)
          + f"; ratios " + " ".join(f"{r['load']['tok_s'] / base:.3f}" for r in results) + f" -> {out_path}")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif sys.argv[1] == "run":
        run(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "/tmp/timeline.json")


# ------------------------------------------------------------------------------------------ raw client (diagnostic)

async def raw_rounds(url, count):
    """A client with almost no CPU per request: 64 kept-alive sockets, each request's bytes pre-built and written in
    one go, responses read until the chunked terminator. Isolates the server's own arrival path."""
    import httpx
    host, port = url.split("//")[1].split(":")
    conns = [await asyncio.open_connection(host, int(port)) for _ in range(64)]

    def req(i):
        body = json.dumps({"model": "bench", "prompt": [5 + i] * 128, "max_tokens": sim.NEW, "temperature": 1.0,
                           "stream": True, "ignore_eos": True, "return_token_ids": True}).encode()
        return (f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode() + body
    reqs = [req(i) for i in range(64)]

    async def read_one(reader):
        buf, first = b"", None
        while not buf.endswith(b"\r\n0\r\n\r\n"):
            buf += await reader.read(65536)
            if first is None and b"data:" in buf:
                first = T()
        assert b"[DONE]" in buf
        return first, T(), buf.count(b"token_ids")

    async def one_round():
        t0 = T()
        for (reader, writer), data in zip(conns, reqs):
            writer.write(data)
        written = T()
        res = await asyncio.gather(*(read_one(r) for r, _ in conns))
        return t0, written, res

    out = []
    await one_round()
    async with httpx.AsyncClient(base_url=url) as side:
        await side.get("/_timeline")
    for _ in range(count):
        t0, written, res = await one_round()
        t1 = max(e for _, e, _ in res)
        async with httpx.AsyncClient(base_url=url) as side:
            server = (await side.get("/_timeline")).json()
        out.append({"t0": t0, "t1": t1, "written": written, "tok_s": 64 * sim.NEW / (t1 - t0),
                    "client": [{"start": t0, "sent": written, "first": f, "end": e, "done_line": e, "port": 0,
                                "headers": f, "chunks": []} for f, e, _ in res], "server": server})
    for _, w in conns:
        w.close()
    return out


def raw(count):
    with sim.serving_child(__file__, os.environ.get("TREE", ROOT)) as port:
        results = asyncio.run(raw_rounds(f"http://127.0.0.1:{port}", count))
        json.dump(results, open("/tmp/tl_raw.json", "w"))
    base = sim.in_process()
    rows = []
    for r in results:
        s, t0 = r["server"], r["t0"]
        f = lambda t: (t - t0) * 1e3
        reads = [e[0] for e in s if e[1] == "read" and e[0] < r["t1"]]
        subs = [e[0] for e in s if e[1] == "submit"]
        g1 = [e[0] for e in s if e[1] == "gather1"][0]
        steps0 = [e[0] for e in s if e[1] == "step0"]
        steps1 = [e[0] for e in s if e[1] == "step1"]
        busy = sum(b - a for a, b in zip(steps0, steps1))
        print("  first step waiting", [e[2] for e in s if e[1] == "step0"][0])
        rows.append((r["tok_s"] / base, f(r["written"]), f(max(reads)), f(subs[-1]), f(g1), f(steps0[0]),
                     f(r["t1"]) - f(steps1[-1]), f(r["t1"]) - busy * 1e3))
    print(f"tree {tree} raw client: ratio, written, last read, last submit, gather end, first step, "
          f"last step end->last end, idle (ms)")
    for row in rows:
        print("  " + " ".join(f"{x:6.3f}" if i == 0 else f"{x:6.1f}" for i, x in enumerate(row)))


if __name__ == "__main__" and sys.argv[1] == "raw":
    raw(int(sys.argv[2]))
