"""The request-level surface of ``LLMEngine`` that the agent loop drives, over a `tandemrl serve` server.

``add_request`` sends one turn to the server (its own HTTP request, on a thread pool) and returns at once; ``step``
waits a little for turns to come back and returns those that did; ``abort`` forgets a turn (the server finishes it,
nobody reads it). So the agent loop (tandemrl/rollout/agent_loop.py) runs unchanged against a server: while some
trajectories wait on their tools, the others' turns are being generated there. The turns share one HTTP client
(its pooled connections), opened at the first turn and closed by ``close``.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Sequence

from tandemrl.backends.loop_client import LoopClient
from tandemrl.backends.server_backend import ServerBackend
from tandemrl.types import Request, Rollout


class ServerTurns:
    """``step`` waits at most ``poll_s`` for a turn, so a tool that returns meanwhile is picked up that late at
    most. ``eos_ids``: the model's end-of-turn tokens (the agent loop asks whether a turn ended with one)."""

    def __init__(self, server: ServerBackend, eos_ids: Sequence[int], max_concurrency: int = 64,
                 poll_s: float = 0.005) -> None:
        self.server = server
        self.eos_ids = frozenset(eos_ids)
        self.poll_s = poll_s
        self.max_concurrency = max_concurrency
        self._pool: ThreadPoolExecutor | None = None  # each turn waits for its answer on a thread of its own
        self._client: LoopClient | None = None
        self._turns: dict[str, Future[Rollout]] = {}

    def add_request(self, request: Request, policy_version: int = 0) -> None:
        pool, client = self._started()
        self._turns[request.request_id] = pool.submit(self._one, client, request, policy_version)

    def step(self) -> list[Rollout]:
        """The turns that came back (waiting up to ``poll_s`` for the first); a server error raises here."""
        if not self._turns:
            return []
        wait(self._turns.values(), timeout=self.poll_s, return_when=FIRST_COMPLETED)
        done = [request_id for request_id, future in self._turns.items() if future.done()]
        return [self._turns.pop(request_id).result() for request_id in done]

    def has_unfinished(self) -> bool:
        return bool(self._turns)

    def abort(self, request_id: str) -> bool:
        future = self._turns.pop(request_id, None)
        if future is not None:
            future.cancel()
        return future is not None

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]:
        return self.server.generate(requests, policy_version, over=self._started()[1])

    def close(self) -> None:
        """Forget the turns in flight and close the client; a later turn opens a new one."""
        for request_id in list(self._turns):
            self.abort(request_id)
        if self._pool is not None and self._client is not None:
            self._client.close()  # first: a thread waiting on a turn gets its cancellation
            self._pool.shutdown()
        self._pool, self._client = None, None

    def _started(self) -> tuple[ThreadPoolExecutor, LoopClient]:
        if self._pool is None or self._client is None:
            self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="server-turn")
            self._client = LoopClient(self.server.open_client)
        return self._pool, self._client

    def _one(self, client: LoopClient, request: Request, policy_version: int) -> Rollout:
        return self.server.generate([request], policy_version, over=client)[0]
