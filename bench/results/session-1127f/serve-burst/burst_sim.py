"""gather_sim (../../session-1127e/gather-sim/) with two additions, for the arrival-burst A/B: the server child records
the prefill batch sizes from each idle start ([first step's, later ones']) and how long after the last request's add its first step began (GET /_first_steps, cleared on read), and a raw-socket client
that writes N pre-built streaming requests on N kept-alive connections back to back (as an RL environment sending a
group would). The child takes the tree from TREE (PYTHONPATH), wired as that tree's server.py wires EngineLoop.

TREE=<tree> python burst_sim.py raw ROUNDS [N]     # raw burst client
TREE=<tree> python burst_sim.py httpx ROUNDS       # bench.serve's client (gather_sim's rounds)
Prints one line: tok/s ratio to in-process per round, its median, and the first-step sizes.
"""
from pathlib import Path
import asyncio, json, os, statistics, sys, time

ROOT = str(Path(__file__).resolve().parents[4])  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "session-1127e" / "gather-sim"))
import gather_sim as sim  # noqa: E402


class RecordingSim(sim.SimEngine):
    def __init__(self):
        super().__init__()
        self.first_steps, self.tails, self.last_add = [], [], 0.0

    def add_request(self, request, version=0):
        self.last_add = time.perf_counter()
        super().add_request(request, version)

    def step(self):
        if self.waiting:  # a prefill: [size] when the engine was idle, else size appended to the last entry
            if not self.running:
                self.first_steps.append([])
                self.tails.append((time.perf_counter() - self.last_add) * 1e3)  # the gather's end after the last add
            self.first_steps[-1].append(len(self.waiting))
        return super().step()


def serve(port):
    import uvicorn
    from starlette.responses import JSONResponse
    from tandemrl.serve import server as srv
    from tandemrl.serve.app import build_app
    from tandemrl.serve.engine_loop import EngineLoop
    from tandemrl.serve.state import Arrivals, ServerState
    import torch, transformers  # noqa: F401 - a server's heap
    engine, arrivals = RecordingSim(), Arrivals()
    if hasattr(srv, "serving_loop"):  # the fix's wiring
        loop = srv.serving_loop(engine, arrivals)
    else:
        loop = EngineLoop(engine, arriving=lambda: arrivals.count)
    state = ServerState(loop=loop, tokenizer=sim.Tok(), model_name="bench", max_model_len=4096, vocab_size=1000,
                        arrivals=arrivals)
    sys.setswitchinterval(srv.SWITCH_INTERVAL_S)
    app = build_app(state)

    async def first_steps(request):
        out = {"first_steps": list(engine.first_steps), "tails_ms": list(engine.tails)}
        engine.first_steps[:], engine.tails[:] = [], []
        return JSONResponse(out)
    app.add_route("/_first_steps", first_steps, methods=["GET"])
    srv.freeze_startup_heap()
    loop.start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", loop="asyncio", http="h11")


async def raw_rounds(port, count, n):
    """n kept-alive sockets, each request pre-built and written in one go, all n back to back; responses read until
    the chunked terminator. One warm-up round."""
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]

    def req(i):
        body = json.dumps({"model": "bench", "prompt": [5 + i] * 128, "max_tokens": sim.NEW, "temperature": 1.0,
                           "stream": True, "ignore_eos": True}).encode()
        return (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode() + body
    reqs = [req(i) for i in range(n)]

    async def read_one(reader):
        buf = b""
        while not buf.endswith(b"\r\n0\r\n\r\n"):
            buf += await reader.read(65536)
        assert b"[DONE]" in buf
        return time.perf_counter()

    async def one_round():
        t0 = time.perf_counter()
        for (_, writer), data in zip(conns, reqs):
            writer.write(data)
        ends = await asyncio.gather(*(read_one(r) for r, _ in conns))
        return {"tok_s": n * sim.NEW / (max(ends) - t0)}

    await one_round()
    out = [await one_round() for _ in range(count)]
    for _, w in conns:
        w.close()
    return out


def main(mode, count, n):
    import httpx
    tree = os.environ.get("TREE", ROOT)
    with sim.serving_child(__file__, tree) as port:
        if mode == "raw":
            results = asyncio.run(raw_rounds(port, count, n))
        else:
            results = asyncio.run(sim.rounds(f"http://127.0.0.1:{port}", count))
            n = 64
        first = httpx.get(f"http://127.0.0.1:{port}/_first_steps").json()
    scale = n / 64  # in-process figure for n requests: the sim's prefill scales with n, bursts do not
    base = sim.in_process()
    ratios = [r["tok_s"] / (base * scale) for r in results]
    print(f"tree {tree} {mode} n={n}: ratio " + " ".join(f"{x:.3f}" for x in ratios)
          + f" median {statistics.median(ratios):.3f}; first steps {first['first_steps']}; gather end after the last"
          f" add, median {statistics.median(first['tails_ms']):.2f} ms", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 64)
