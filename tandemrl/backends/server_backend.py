"""A RolloutBackend that samples from a separate `tandemrl serve` process over its OpenAI-compatible API.

The requests of one call go out concurrently (the samples of one prompt as one request with ``n``), each asking
for its token ids and log-probs. A batch is all or nothing: if the server does not answer (connection refused or
cut, a 5xx, a timeout) the whole batch is sent again after a backoff, ``retries`` times, and then the call fails
with a message naming the server — the trainer never sees part of a batch. Every rollout carries the policy
version the server sampled it with; one more than ``max_staleness`` versions behind the trainer is refused (after
one ``resync``, e.g. pushing the weights again to a server that restarted at version 0).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable, Sequence

import httpx

from tandemrl.backends.connection_slots import ConnectionSlots
from tandemrl.types import Request, RequestStats, Rollout, SamplingParams

if TYPE_CHECKING:
    from tandemrl.backends.loop_client import LoopClient


class RolloutServerError(ConnectionError):
    """The rollout server did not answer, after every retry."""


class StaleRolloutError(ValueError):
    """The server sampled with weights older (or newer) than rollout.max_staleness allows."""


class _Retryable(Exception):
    pass


class ServerBackend:
    def __init__(self, url: str, *, max_staleness: int = 0, retries: int = 3, backoff_s: float = 2.0,
                 timeout_s: float = 600.0, max_concurrency: int = 64, model_name: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url.rstrip("/")
        self.max_staleness = max_staleness
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.model_name = model_name
        self.resync: Callable[[int], None] | None = None  # pushes the trainer's weights again (setup.py)
        self._transport = transport
        self._sleep = sleep

    # ------------------------------------------------------------------ protocol

    def generate(self, requests: Sequence[Request], policy_version: int = 0,
                 over: LoopClient | None = None) -> list[Rollout]:
        """``over``: send through that client's connections (``open_client``); None: a client of the call's own."""
        rollouts = self._with_retries(requests, over)
        if self._stale(rollouts, policy_version) and self.resync is not None:
            self.resync(policy_version)
            rollouts = self._with_retries(requests, over)
        stale = self._stale(rollouts, policy_version)
        if stale:
            raise StaleRolloutError(
                f"the rollout server at {self.url} sampled with policy version {stale.policy_version}; the trainer "
                f"is at {policy_version} and rollout.max_staleness = {self.max_staleness}. Did the server restart, "
                "or does another trainer push to it?")
        return rollouts

    def sleep(self) -> None:
        """The server's memory is its own."""

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass

    def open_client(self) -> httpx.AsyncClient:
        """A client to the server, keeping up to ``max_concurrency`` connections open (connection_slots.py: not
        httpx's own pool, whose cost per request grows with its connections)."""
        return httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(self.timeout_s, connect=10.0),
                                 transport=self._transport or ConnectionSlots(self.max_concurrency))

    # ------------------------------------------------------------------ batches

    def _stale(self, rollouts: list[Rollout], version: int) -> Rollout | None:
        return next((r for r in rollouts if r.finish_reason != "error"
                     and not 0 <= version - r.policy_version <= self.max_staleness), None)

    def _with_retries(self, requests: Sequence[Request], over: LoopClient | None) -> list[Rollout]:
        errors = []
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return over.run(self._batch, requests) if over is not None else asyncio.run(self._own_batch(requests))
            except _Retryable as exc:
                errors.append(str(exc))
        raise RolloutServerError(
            f"the rollout server at {self.url} did not answer after {self.retries + 1} attempts "
            f"(rollout.server_retries = {self.retries}); the batch was not used. Last error: {errors[-1]}")

    async def _own_batch(self, requests: Sequence[Request]) -> list[Rollout]:
        async with self.open_client() as http:
            return await self._batch(http, requests)

    async def _batch(self, http: httpx.AsyncClient, requests: Sequence[Request]) -> list[Rollout]:
        limits = asyncio.Semaphore(self.max_concurrency)
        if self.model_name is None:
            self.model_name = await self._served_model(http)

        async def run(group: list[Request]) -> list[Rollout]:
            async with limits:
                return await self._complete(http, group)

        try:
            results = await asyncio.gather(*(run(g) for g in _groups(requests)))
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        return [r for group in results for r in group]

    async def _served_model(self, http: httpx.AsyncClient) -> str:
        try:
            response = await http.get("/v1/models")
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise _Retryable(f"GET /v1/models: {response.status_code} {response.text[:200]}")
        return response.json()["data"][0]["id"]

    async def _complete(self, http: httpx.AsyncClient, group: list[Request]) -> list[Rollout]:
        first = group[0]
        started = time.perf_counter()
        response = await http.post("/v1/completions", json=_body(self.model_name, first, len(group)))
        if response.status_code >= 500:
            raise _Retryable(f"POST /v1/completions: {response.status_code} {response.text[:200]}")
        body = response.json()
        if response.status_code >= 400:
            message = body.get("error", {}).get("message", response.text[:200])
            return [Rollout(r.request_id, list(r.prompt_ids), [], [], "error", error=message) for r in group]
        elapsed = time.perf_counter() - started
        return [_rollout(r, choice, elapsed) for r, choice in zip(group, body["choices"])]


def _groups(requests: Sequence[Request]) -> list[list[Request]]:
    """Runs of consecutive requests with the same prompt and params (a GRPO group): one HTTP request with ``n``."""
    groups: list[list[Request]] = []
    for request in requests:
        last = groups[-1][0] if groups else None
        if last is not None and last.prompt_ids == request.prompt_ids and last.params == request.params:
            groups[-1].append(request)
        else:
            groups.append([request])
    return groups


def _body(model: str | None, request: Request, n: int) -> dict:
    p: SamplingParams = request.params
    return {"model": model, "prompt": list(request.prompt_ids), "n": n, "max_tokens": p.max_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "stop": list(p.stop) or None,
            "ignore_eos": p.ignore_eos, "seed": p.seed, "logprobs": 1, "return_token_ids": True}


def _rollout(request: Request, choice: dict, elapsed: float) -> Rollout:
    ids = list(choice["token_ids"])
    logprobs = list(choice["logprobs"]["token_logprobs"]) if choice.get("logprobs") else []
    stats = _stats(choice.get("stats") or {}, len(request.prompt_ids), len(ids), elapsed)
    return Rollout(request.request_id, list(request.prompt_ids), ids, logprobs, choice["finish_reason"],
                   text=choice["text"], policy_version=int(choice["policy_version"]), stats=stats,
                   version_runs=[(int(start), int(v)) for start, v in choice.get("version_runs") or []])


def _stats(server: dict, prompt_tokens: int, generated: int, elapsed: float) -> RequestStats:
    """The server's per-request stats (times relative to arrival), or the round trip's where it sent none."""
    return RequestStats(arrival_time=0.0, first_scheduled_time=server.get("queue_time"),
                        first_token_time=server.get("time_to_first_token"),
                        finished_time=server.get("latency", elapsed), prompt_tokens=prompt_tokens,
                        generated_tokens=generated, cached_prompt_tokens=server.get("cached_prompt_tokens", 0),
                        peak_kv_blocks=server.get("peak_kv_blocks", 0), kv_block_bytes=server.get("kv_block_bytes", 0),
                        preemptions=server.get("preemptions", 0))
