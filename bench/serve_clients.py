"""bench.serve's load test: N concurrent streaming clients (httpx, SSE), in one process or split over several.

One Python process writing 64 requests spends ~20-40 ms in httpx before its first request's bytes leave (each
request's preparation runs before any of them is written), which the server's throughput then counts. Environment
processes in RL each send their own, so the load test can split the N streams over ``procs`` client processes
(``python -m bench.serve_clients URL``, one JSON command a line on stdin, one JSON answer a line on stdout), each
with its own kept-alive connections. All of a round's processes start at one instant of ``time.perf_counter``
(CLOCK_MONOTONIC on Linux: the same clock in every process); the round's wall time runs from it to the last
stream's end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from tandemrl.backends.connection_slots import ConnectionSlots

REPO = Path(__file__).resolve().parents[1]  # where `python -m bench.serve_clients` imports from
START_DELAY_S = 0.1  # from sending a round's commands to its common start: every process is waiting by then


async def one_client(http: httpx.AsyncClient, prompt: list[int], new_tokens: int) -> dict:
    body = {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 1.0, "stream": True,
            "ignore_eos": True, "return_token_ids": True}
    start = time.perf_counter()
    first, tokens, sent = None, 0, 0.0

    async def trace(event: str, info: dict) -> None:
        nonlocal sent
        if event == "http11.send_request_body.complete":  # the client's share ends: connected, request written
            sent = time.perf_counter() - start

    async with http.stream("POST", "/v1/completions", json=body, extensions={"trace": trace}) as response:
        headers = time.perf_counter() - start  # the server took the request (the engine gets it as the stream starts)
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ids = json.loads(line[6:])["choices"][0].get("token_ids", [])
            if ids and first is None:
                first = time.perf_counter() - start
            tokens += len(ids)
    end = time.perf_counter()
    return {"latency": end - start, "ttft": first or 0.0, "headers": headers, "tokens": tokens, "sent": sent,
            "end": end}


def open_client(url: str, clients: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=600, transport=ConnectionSlots(clients))


async def streams(http: httpx.AsyncClient, prompts: list[list[int]], new_tokens: int) -> list[dict]:
    return await asyncio.gather(*(one_client(http, p, new_tokens) for p in prompts))


def summarize(results: list[dict], wall: float, new_tokens: int) -> dict:
    short = [r["tokens"] for r in results if r["tokens"] != new_tokens]
    if short:
        raise RuntimeError(f"{len(short)} streams ended early (tokens received: {short[:5]}, asked {new_tokens})")
    latency, ttft = [r["latency"] for r in results], [r["ttft"] for r in results]
    # the TTFT's two shares: connect + HTTP until the response headers, then the engine's until the first token;
    # the first one's client part: until the request was written (connect, the pool, the client's event loop)
    headers, engine = [r["headers"] for r in results], [r["ttft"] - r["headers"] for r in results]
    return {"clients": len(results), "wall_s": wall, "tok_s": sum(r["tokens"] for r in results) / wall,
            "latency_p50_s": float(np.percentile(latency, 50)), "latency_p99_s": float(np.percentile(latency, 99)),
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "headers_p50_s": float(np.percentile(headers, 50)), "headers_max_s": max(headers),
            "sent_p50_s": float(np.percentile([r["sent"] for r in results], 50)),
            "sent_max_s": max(r["sent"] for r in results),
            "headers_to_first_token_p50_s": float(np.percentile(engine, 50))}


class ClientProcesses:
    """``procs`` client processes against ``url``, each keeping its connections alive from round to round."""

    def __init__(self, url: str, procs: int) -> None:
        self.procs = procs
        command = [sys.executable, "-m", "bench.serve_clients", url]
        self._children = [subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                          for _ in range(procs)]

    def round(self, prompts: list[list[int]], new_tokens: int, fresh: bool) -> dict:
        """One round of len(prompts) streams split evenly over the processes; ``fresh``: on connections opened for
        it (the kept ones otherwise)."""
        start_at = time.perf_counter() + START_DELAY_S
        for part, child in zip(np.array_split(np.arange(len(prompts)), self.procs), self._children):
            command = {"prompts": [prompts[i] for i in part], "new_tokens": new_tokens, "fresh": fresh,
                       "start_at": start_at}
            child.stdin.write(json.dumps(command) + "\n")
            child.stdin.flush()
        results = []
        for child in self._children:
            answer = json.loads(child.stdout.readline() or '{"error": "the client process exited"}')
            if "error" in answer:
                raise RuntimeError(f"a client process failed: {answer['error']}")
            results += answer["results"]
        summary = summarize(results, max(r["end"] for r in results) - start_at, new_tokens)
        return {**summary, "client_procs": self.procs}

    def close(self) -> None:
        for child in self._children:
            child.stdin.close()
        for child in self._children:
            child.wait(timeout=30)

    def __enter__(self) -> ClientProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def serve_commands(url: str) -> None:
    """A client process: each stdin line a round (see ClientProcesses.round), answered on stdout."""
    loop = asyncio.get_running_loop()
    kept: httpx.AsyncClient | None = None
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            prompts = command["prompts"]
            if kept is None:
                kept = open_client(url, len(prompts))
            await asyncio.sleep(max(0.0, command["start_at"] - time.perf_counter()))
            try:
                if command["fresh"]:
                    async with open_client(url, len(prompts)) as fresh:
                        results = await streams(fresh, prompts, command["new_tokens"])
                else:
                    results = await streams(kept, prompts, command["new_tokens"])
                answer = {"results": results}
            except Exception as exc:  # noqa: BLE001 - reported to the bench, which records the stage as failed
                answer = {"error": repr(exc)}
            print(json.dumps(answer), flush=True)
    finally:
        if kept is not None:
            await kept.aclose()


if __name__ == "__main__":
    asyncio.run(serve_commands(sys.argv[1]))
