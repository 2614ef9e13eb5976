"""The contract between the trainer and whatever produces its rollouts."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from tandemrl.types import Request, Rollout


@runtime_checkable
class RolloutBackend(Protocol):
    """Turns tokenised requests into finished rollouts.

    ``generate`` returns one ``Rollout`` per request, in request order; a request that cannot run comes
    back with ``finish_reason="error"`` and ``error`` set instead of failing the whole call. Every rollout
    carries ``policy_version``. ``sleep`` frees the generation cache memory while the trainer steps and
    ``wake`` makes it available again; ``close`` releases everything the backend holds.
    """

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...

    def close(self) -> None: ...
