"""rollout.mode = "async": a rollout worker samples the next batches while the trainer updates.

The trainer draws each step's job (prompts, group sizes, seed) on its own thread and keeps the worker at most
``rollout.max_staleness`` batches ahead of the step it is on. The worker thread samples and scores each job with its
own engine (``SteppingWorker``: a job's requests join the running engine at once, beside the batches before it; with
the tool-calling agent loop, ``RolloutWorker``: a batch at a time) over its own copy of the weights
(``WeightMirror``: published after every update, applied between two engine steps, so running sequences continue
under the new weights and every token records the version that sampled it: ``Rollout.version_runs``), and puts the
scored groups, tagged with their oldest token's version, on the :class:`RolloutQueue`. The trainer takes a step's
groups from the queue; groups whose oldest token is more than ``max_staleness`` versions behind it are dropped,
counted and replaced. With ``max_staleness = 0`` the worker samples step s's batch only after update s - 1 was
published: the same batch, with the same weights, as the synchronous loop. With rollout.backend = "server" the worker
sends its jobs to the server instead (the trainer's sync.kind carries the weights); with rollout.env_port the groups
come from environment processes through the :class:`GroupReceiver` (tandemrl/envs/).
"""

from __future__ import annotations

import time
import traceback
from typing import Callable, Protocol

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.backends.hf_backend import eos_token_ids
from tandemrl.backends.server_backend import ServerBackend
from tandemrl.engine.engine import LLMEngine
from tandemrl.models.load import resolve_device
from tandemrl.train.agent_setup import run_agent_loop
from tandemrl.train.group_receiver import GroupReceiver
from tandemrl.train.job_thread import JobThread
from tandemrl.train.rollout_jobs import RolloutJob, draw_job, prepare_job, run_job
from tandemrl.train.rollout_queue import QueuedGroups, RolloutProducerError, RolloutQueue, oldest_version
from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.train.scored_groups import join_groups
from tandemrl.train.setup import Run
from tandemrl.train.stepping_worker import SteppingWorker
from tandemrl.train.weight_mirror import WeightMirror

ANY_VERSION = 2**62  # a ServerBackend staleness bound that never refuses
MAX_EXTRA_DROPS = 3  # stale batches in one take beyond a full queue before the run stops: the weights are stuck
Sampler = Callable[[RolloutJob, int], ScoredRollouts]  # (job, policy version) -> the scored batch


class RolloutWorker(JobThread):
    """Runs jobs in order on its own thread, a whole batch at a time: applies the newest published weights, samples,
    puts the result on ``out``. An exception ends the worker and is put on ``out`` (the trainer's next take raises
    it)."""

    def __init__(self, sample: Sampler, mirror: WeightMirror | None, out: RolloutQueue) -> None:
        self._sample = sample
        super().__init__(mirror, out)

    def _run(self) -> None:
        job = None
        try:
            while (job := self._jobs.get()) is not None:
                # the engine applies later pushes between two of its steps (start_async_rollouts); a server its own
                version = self.mirror.apply() if self.mirror is not None else -1
                started = time.perf_counter()
                self._busy(True)
                scored = self._sample(job, version)
                self._busy(False)
                seconds = time.perf_counter() - started
                self.out.put(QueuedGroups(scored, oldest_version(scored), sample_s=seconds))
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which stops the run with it
            where = f"step {job.index}'s batch" if job is not None else "a batch"
            self.out.fail(f"the rollout worker failed while sampling {where} (rollout.mode = 'async'): "
                          f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


class Producer(Protocol):
    """Where the groups come from: the rollout worker (jobs drawn by the trainer) or environments (their own)."""

    out: RolloutQueue
    mirror: WeightMirror | None  # None: the weights travel another way (a server's sync.kind)
    trainer_version: int

    def submit(self, job: RolloutJob) -> None: ...

    def gone(self) -> str | None: ...

    def stop(self) -> None: ...


class AsyncRollouts:
    """The trainer's side: keeps the worker supplied with jobs (``draw``; None: the producer draws its own) and
    takes each step's groups from the queue."""

    def __init__(self, draw: Callable[[int], RolloutJob] | None, producer: Producer, max_staleness: int,
                 groups_per_step: int, first_index: int, release: Callable[[], None] = lambda: None) -> None:
        self._draw, self.producer, self.max_staleness, self._release = draw, producer, max_staleness, release
        self.groups_per_step = groups_per_step
        self._next_index = first_index  # the next job's step index
        self.dropped_total = 0
        self._dropped_in_take = 0
        now = time.perf_counter()
        self._clock = (now, self._busy_s(now))

    def next(self, step: int, trainer_version: int) -> tuple[ScoredRollouts, dict[str, float]]:
        """Step ``step``'s groups (the trainer holds ``trainer_version``) and the metrics of the wait."""
        self.producer.trainer_version = trainer_version
        while self._draw is not None and self._next_index <= step + self.max_staleness:  # <= max_staleness ahead
            self._submit()
        self._dropped_in_take = 0
        taken = self.producer.out.take(self.groups_per_step, trainer_version, self.max_staleness,
                                       on_drop=lambda item: self._replace(item, trainer_version),
                                       alive=self.producer.gone)
        scored = join_groups([part.scored for part in taken.parts])
        self.dropped_total += taken.dropped_groups
        lags = [trainer_version - r.policy_version for r in scored.rollouts]
        busy = self._worker_busy()
        return scored, {
            "async/version_lag_mean": sum(lags) / len(lags), "async/version_lag_max": max(lags),
            "async/dropped_groups": taken.dropped_groups, "async/dropped_groups_total": self.dropped_total,
            "async/queue_groups": self.producer.out.depth_groups, "async/wait_s": taken.waited_s,
            "async/sample_s": sum(part.sample_s for part in taken.parts),
            **({"async/worker_busy": busy} if busy is not None else {}),
            **({"async/worker_pause_s": self.producer.mirror.pause_s} if self.producer.mirror is not None else {}),
        }

    def publish(self, version: int) -> dict[str, float]:
        """After an update: stage the trainer's weights for the worker (applied before its next batch)."""
        self.producer.trainer_version = version
        mirror = self.producer.mirror
        if mirror is None:  # a server: run.sync pushed the weights there already
            return {}
        return {"async/push_s": mirror.publish(version), "async/push_mb": mirror.bytes / 2**20}

    def close(self) -> None:
        self.producer.stop()
        self._release()

    def _replace(self, dropped: QueuedGroups, trainer_version: int) -> None:
        """Groups came back too stale: ask for another batch, unless the producer's weights plainly stopped
        following (more stale groups in one take than the queue holds, and a few batches more)."""
        self._dropped_in_take += dropped.groups
        limit = self.producer.out.capacity_groups + MAX_EXTRA_DROPS * self.groups_per_step
        if self._dropped_in_take > limit:
            raise RolloutProducerError(
                f"{self._dropped_in_take} groups in a row were sampled more than rollout.max_staleness = "
                f"{self.max_staleness} versions behind the trainer (the last by version {dropped.version}, the "
                f"trainer holds {trainer_version}): the rollouts' weights do not follow the trainer's")
        if self._draw is not None:
            self._submit()

    def _submit(self) -> None:
        assert self._draw is not None
        self.producer.submit(self._draw(self._next_index))
        self._next_index += 1

    def _busy_s(self, now: float) -> float | None:
        busy_s = getattr(self.producer, "busy_s", None)  # producers outside this process do not know it
        return busy_s(now) if busy_s is not None else None

    def _worker_busy(self) -> float | None:
        """The share of the wall time since the last take that the worker spent sampling (None: not known)."""
        now = time.perf_counter()
        busy = self._busy_s(now)
        (then, busy_then), self._clock = self._clock, (now, busy)
        if busy is None or busy_then is None:
            return None
        return (busy - busy_then) / max(now - then, 1e-9)


def follow_pushes(engine: LLMEngine, mirror: WeightMirror) -> None:
    """Between two of ``engine``'s steps, apply the weights the trainer published last (if newer) and name their
    version: a batch in progress continues under them, its sequences' K/V so far stays (as a server's does)."""
    engine.set_policy_version(mirror.applied)
    engine.between_steps = lambda: engine.set_policy_version(mirror.apply())


def start_async_rollouts(run: Run, first_step: int, version: int) -> AsyncRollouts:
    """Where the run's groups come from; the first job is step ``first_step``'s. With the engine a worker thread
    samples a copy of the trainer's current weights (``version``) on ``rollout.async_device`` with an engine (and
    agent loop) of its own; with ``rollout.backend = "server"`` it sends the jobs to the server, which the trainer's
    ``sync.kind`` pushes to; with ``rollout.env_port`` set, environment processes push the groups."""
    cfg = run.cfg
    r = cfg.rollout
    if run.engine_model is not None:
        raise ValueError("rollout.mode = 'async' runs in one process; under torchrun use rollout.mode = 'sync'")
    queue_ = RolloutQueue(capacity_groups=(r.max_staleness + 2) * r.prompts_per_step)
    if r.env_port is not None:
        receiver = GroupReceiver(queue_, r.max_staleness, port=r.env_port)
        print(f"environments: push scored groups to {receiver.url}/groups (python -m tandemrl.envs --trainer "
              f"{receiver.url})", flush=True)
        return AsyncRollouts(None, receiver, r.max_staleness, r.prompts_per_step, first_step)
    mirror = None
    if r.backend == "server":  # the queue judges staleness: the backend takes whatever version the server holds
        backend = ServerBackend(r.server_url or "", max_staleness=ANY_VERSION, retries=r.server_retries,
                                backoff_s=r.server_backoff_s, timeout_s=r.server_timeout_s)
    else:
        device = resolve_device(r.async_device) if r.async_device else run.device
        mirror = WeightMirror.copy_of(run.model, device, version)
        backend = EngineBackend(mirror.target, run.tokenizer, cfg.engine, device=device)
        follow_pushes(backend.engine, mirror)
    # tools: the agent loop over the worker's engine, or turn by turn over the server
    agent = run_agent_loop(cfg, backend, run.tokenizer, eos_token_ids(run.model, run.tokenizer), run.tool_funcs)
    worker: Producer
    if mirror is not None and agent is None:  # batches join the running engine as they come
        assert isinstance(backend, EngineBackend)
        worker = SteppingWorker(lambda job: prepare_job(run, job), backend.generating, mirror, queue_)
    else:  # the agent loop drives the engine itself, a batch at a time; a server takes whole batches
        # the engine labels rollouts with the version it holds; a server with its own (any version passes its check)
        sample = lambda job, held: run_job(run, job, backend, agent, held if mirror is not None else ANY_VERSION)
        worker = RolloutWorker(sample, mirror, queue_)
    def release() -> None:
        if agent is not None:
            agent.close()  # a server's turns: their HTTP client
        backend.close()

    return AsyncRollouts(lambda index: draw_job(run, index), worker, r.max_staleness, r.prompts_per_step, first_step,
                         release=release)
