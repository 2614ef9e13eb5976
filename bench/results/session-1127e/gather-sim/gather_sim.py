"""The server's scheduling in a GPU-like regime on the CPU: the real app, EngineLoop and uvicorn in a child process
over a fake engine whose steps take a GPU step's time without holding the GIL (sleep) plus some Python host work
(spin): prefill PREFILL_MS per 64 prompts, decode bursts of 32 tokens of BURST_MS, HOST_MS of Python per step.
64 streaming clients x 256 tokens from this process (bench.serve's client), kept-alive rounds after a warm-up.
The in-process figure is the same engine stepped with all 64 added at once.

python gather_sim.py serve PORT        (child; TREE=<a tree> picks the tandemrl it imports)
python gather_sim.py run [ROUNDS]      (parent: starts the child, prints tok/s per round and the in-process ratio)
"""
import asyncio, contextlib, sys, time, subprocess, os, statistics
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[4])  # the repository

PREFILL_MS, BURST_MS, HOST_MS, BURST, NEW = 16.0, 37.0, 3.0, 32, 256


def spin(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class SimEngine:
    def __init__(self):
        self.waiting, self.running, self.tokens = [], {}, {}

    def add_request(self, request, version=0):
        self.waiting.append(request)

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def has_waiting(self):
        return bool(self.waiting)

    def abort(self, rid):
        self.running.pop(rid, None)

    def progress(self, sent):
        return [(rid, self.tokens[rid][n:], [0.0] * (len(self.tokens[rid]) - n)) for rid, n in sent.items()
                if rid in self.tokens and len(self.tokens[rid]) > n]

    def step(self):
        from tandemrl.types import Rollout
        spin(HOST_MS)
        if self.waiting:
            batch, self.waiting = self.waiting, []
            time.sleep(PREFILL_MS / 1e3 * len(batch) / 64)
            for r in batch:
                self.running[r.request_id] = r
                self.tokens[r.request_id] = [1]
            return []
        time.sleep(BURST_MS / 1e3)
        done = []
        for rid, r in list(self.running.items()):
            toks = self.tokens[rid]
            toks += [2] * min(BURST, r.params.max_tokens - len(toks))
            if len(toks) >= r.params.max_tokens:
                del self.running[rid]
                done.append(Rollout(rid, r.prompt_ids, toks, [0.0] * len(toks), "length"))
                del self.tokens[rid]
        return done


class Tok:
    chat_template = None
    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


def serve(port):
    import uvicorn
    from tandemrl.serve.app import build_app
    from tandemrl.serve.engine_loop import EngineLoop
    from tandemrl.serve.server import SWITCH_INTERVAL_S, freeze_startup_heap
    from tandemrl.serve.state import Arrivals, ServerState
    import torch, transformers  # noqa: F401 - a server's heap
    arrivals = Arrivals()
    loop = EngineLoop(SimEngine(), arriving=lambda: arrivals.count)
    state = ServerState(loop=loop, tokenizer=Tok(), model_name="bench", max_model_len=4096, vocab_size=1000,
                        arrivals=arrivals)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = build_app(state)
    freeze_startup_heap()
    loop.start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", loop="asyncio", http="h11")


def in_process():
    from tandemrl.types import Request, SamplingParams
    eng = SimEngine()
    start = time.perf_counter()
    for i in range(64):
        eng.add_request(Request(f"r{i}", [1] * 128, SamplingParams(max_tokens=NEW, ignore_eos=True)))
    n = 0
    while eng.has_unfinished():
        n += sum(len(r.completion_ids) for r in eng.step())
    return n / (time.perf_counter() - start)


async def rounds(url, count):
    sys.path.insert(0, ROOT)
    from bench.serve import load_test, open_client
    prompts = [[5 + i] * 128 for i in range(64)]
    out = []
    async with open_client(url, 64) as http:
        await load_test(http, prompts, NEW)
        for _ in range(count):
            r = await load_test(http, prompts, NEW)
            out.append(r)
    return out


@contextlib.contextmanager
def serving_child(script, tree):
    """`script serve PORT` in a child importing `tree`; yields PORT once /health answers (the other scripts too)."""
    port = 18000 + os.getpid() % 1000
    child = subprocess.Popen([sys.executable, script, "serve", str(port)], env={**os.environ, "PYTHONPATH": tree})
    try:
        import httpx
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        yield port
    finally:
        child.terminate(); child.wait()


def run(count):
    tree = os.environ.get("TREE", ROOT)
    with serving_child(__file__, tree) as port:
        results = asyncio.run(rounds(f"http://127.0.0.1:{port}", count))
    base = in_process()
    ratios = [r["tok_s"] / base for r in results]
    print(f"tree {tree}: in-process {base:.0f} tok/s; server rounds "
          + " ".join(f"{r['tok_s']:.0f}" for r in results) + f"; ratio median {statistics.median(ratios):.3f} "
          f"(ttft p50 " + " ".join(f"{r['ttft_p50_s']*1e3:.0f}" for r in results) + " ms)")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        run(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
