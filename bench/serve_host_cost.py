"""The server's event-loop CPU per completion request, without HTTP or a model (issue 40 point 3): the real app
(routes, middleware, SSE response, engine loop thread) over a fake engine that finishes every request with 4 tokens
in one step; 64 streaming requests at a time through the ASGI interface, as uvicorn would hand them over.

    python -m bench.serve_host_cost [--rounds 20] [--gc freeze|default] [--profile]

``--gc freeze``: the start-up heap frozen as `tandemrl serve` does (server.freeze_startup_heap); torch and
transformers are imported first either way, so the collector has a server's heap to walk.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import time
from typing import Any

from tandemrl.serve.app import build_app
from tandemrl.serve.engine_loop import EngineLoop
from tandemrl.serve.state import Arrivals, ServerState
from tandemrl.types import Request, Rollout

CONCURRENT = 64


class _LetterTokenizer:
    chat_template = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class _InstantEngine:
    """Finishes every request it holds in one step, with 4 tokens."""

    def __init__(self) -> None:
        self.pending: list[Request] = []

    def has_unfinished(self) -> bool:
        return bool(self.pending)

    def add_request(self, request: Request, policy_version: int) -> None:
        self.pending.append(request)

    def abort(self, request_id: str) -> None:
        self.pending = [r for r in self.pending if r.request_id != request_id]

    def progress(self, sent: dict[str, int]) -> list:
        return []

    def step(self) -> list[Rollout]:
        done = [Rollout(r.request_id, r.prompt_ids, [1, 2, 3, 4], [-0.1] * 4, "length", "bcde") for r in self.pending]
        self.pending = []
        return done


async def _post(app: Any, body: bytes) -> list[dict]:
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the client never leaves
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    await app(scope, receive, send)
    return sent


async def measure(rounds: int, profile: cProfile.Profile | None) -> float:
    """Event-loop CPU seconds per request."""
    arrivals = Arrivals()
    loop = EngineLoop(_InstantEngine(), arriving=lambda: arrivals.count)
    state = ServerState(loop=loop, tokenizer=_LetterTokenizer(), model_name="m", max_model_len=4096,
                        vocab_size=1000, arrivals=arrivals)
    app = build_app(state)
    body = json.dumps({"model": "m", "prompt": list(range(128)), "max_tokens": 4, "stream": True}).encode()
    loop.start()
    try:
        await asyncio.gather(*[_post(app, body) for _ in range(CONCURRENT)])  # warm-up
        cpu = time.thread_time()
        if profile is not None:
            profile.enable()
        for _ in range(rounds):
            answers = await asyncio.gather(*[_post(app, body) for _ in range(CONCURRENT)])
        if profile is not None:
            profile.disable()
        cpu = time.thread_time() - cpu
    finally:
        loop.stop()
    last = b"".join(m.get("body", b"") for m in answers[-1])
    assert last.endswith(b"data: [DONE]\n\n") and b'"text": "bcde"' in last, last  # every request was answered
    return cpu / (rounds * CONCURRENT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--gc", choices=("freeze", "default"), default="freeze")
    parser.add_argument("--profile", action="store_true", help="cProfile on thread CPU time, top 25 by own time")
    args = parser.parse_args(argv)
    import torch  # noqa: F401 - a server's heap, for the collector to walk
    import transformers  # noqa: F401

    if args.gc == "freeze":
        from tandemrl.serve.server import freeze_startup_heap  # here: a tree before it can run --gc default

        freeze_startup_heap()
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    per_request = asyncio.run(measure(args.rounds, profile))
    print(f"event-loop CPU per request: {per_request * 1e6:.0f} us ({args.rounds} rounds of {CONCURRENT}, "
          f"gc {args.gc}; {len(gc.get_objects())} objects tracked)")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
