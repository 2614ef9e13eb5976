"""The in-process rollout worker that keeps its engine stepping across batches (rollout.mode = "async").

Every submitted job's requests join the running engine as soon as the job arrives, while the batches before it are
still running (continuous batching across steps); the weights the trainer publishes are applied between two engine
steps (``follow_pushes``), so sequences that are running continue under them and every token records its version.
Batches are scored and queued in job order as their last rollout finishes. With one job at a time
(``rollout.max_staleness = 0``) it samples exactly as one ``generate`` call of the synchronous loop.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, ContextManager

from tandemrl.engine.engine import LLMEngine
from tandemrl.train.job_thread import JobThread
from tandemrl.train.rollout_jobs import RolloutJob
from tandemrl.train.rollout_queue import QueuedGroups, RolloutQueue, oldest_version
from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.train.weight_mirror import WeightMirror
from tandemrl.types import Request, Rollout

# a job -> its requests, and the function that scores their rollouts (in request order)
Prepare = Callable[[RolloutJob], tuple[list[Request], Callable[[list[Rollout]], ScoredRollouts]]]


@dataclass
class _OpenJob:
    job: RolloutJob
    score: Callable[[list[Rollout]], ScoredRollouts]
    rollouts: list[Rollout | None]
    started: float
    missing: int = field(init=False)

    def __post_init__(self) -> None:
        self.missing = len(self.rollouts)


class SteppingWorker(JobThread):
    """The Producer of ``AsyncRollouts`` for an in-process engine without the agent loop. ``generating``: the
    engine, ready to decode (``EngineBackend.generating``), entered whenever it starts from idle. ``busy_s(now)``:
    the seconds the engine had work (not waiting for a job or for room in the queue)."""

    def __init__(self, prepare: Prepare, generating: Callable[[], ContextManager[LLMEngine]], mirror: WeightMirror,
                 out: RolloutQueue) -> None:
        self._prepare, self._generating = prepare, generating
        self._open: list[_OpenJob] = []  # in job order
        self._where: dict[str, tuple[_OpenJob, int]] = {}  # request id -> its job, its position there
        self._stopping = False
        self._admitting: RolloutJob | None = None  # the job whose requests are being prepared (for an error)
        super().__init__(mirror, out)

    def _run(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:  # the engine is idle: wait for a job
                self._busy(True)
                with self._generating() as engine:  # as one synchronous generate: seeded streams afresh
                    self._admit(engine, job)
                    self._step_until_idle(engine)
                self._busy(False)
                if self._stopping:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which stops the run with it
            failed = self._admitting or (self._open[0].job if self._open else None)
            where = f"step {failed.index}'s batch" if failed is not None else "a batch"
            self.out.fail(f"the rollout worker failed while sampling {where} (rollout.mode = 'async'): "
                          f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    def _step_until_idle(self, engine: LLMEngine) -> None:
        """Step while any job is open, adding jobs submitted meanwhile; then read back what is still in flight."""
        while self._open:
            while not self._stopping and not self._jobs.empty():
                job = self._jobs.get()
                if job is None:
                    self._stopping = True
                else:
                    self._admit(engine, job)
            if self._stopping:
                return
            for rollout in engine.step():
                self._collect(rollout)
            self._finish_ready()
        while engine.has_unfinished():  # a step computed past the last finished sequence: nobody waits for it
            engine.step()

    def _admit(self, engine: LLMEngine, job: RolloutJob) -> None:
        self._admitting = job
        requests, score = self._prepare(job)
        self._admitting = None
        open_job = _OpenJob(job, score, [None] * len(requests), time.perf_counter())
        self._open.append(open_job)
        for i, request in enumerate(requests):
            self._where[request.request_id] = (open_job, i)
            engine.add_request(request, engine.policy_version or 0)  # a rejected one comes back from step()

    def _collect(self, rollout: Rollout) -> None:
        open_job, i = self._where.pop(rollout.request_id)
        open_job.rollouts[i] = rollout
        open_job.missing -= 1

    def _finish_ready(self) -> None:
        """Score and queue the finished jobs at the head, in job order."""
        while self._open and self._open[0].missing == 0:
            open_job = self._open.pop(0)
            scored = open_job.score(open_job.rollouts)  # type: ignore[arg-type]  # all present
            queued = QueuedGroups(scored, oldest_version(scored), sample_s=time.perf_counter() - open_job.started)
            self._busy(False)  # the put waits while the queue is full: not busy
            self.out.put(queued)
            self._busy(True)
