"""The plumbing every in-process rollout producer shares: a thread, the jobs handed to it, and how it stops."""

from __future__ import annotations

import queue
import threading
import time

from tandemrl.train.rollout_jobs import RolloutJob
from tandemrl.train.rollout_queue import RolloutQueue
from tandemrl.train.weight_mirror import WeightMirror


class JobThread:
    """Takes jobs (``submit``) for ``_run`` on its own thread, which puts what it makes on ``out``; None on the job
    queue asks it to stop. A subclass sets its own fields before calling ``__init__`` (the thread starts there)."""

    def __init__(self, mirror: WeightMirror | None, out: RolloutQueue) -> None:
        self.mirror, self.out = mirror, out
        self._jobs: queue.Queue[RolloutJob | None] = queue.Queue()
        # (seconds spent sampling up to the current busy period, when that period began or None: idle), replaced
        # whole so that the trainer's thread never reads half an update
        self._busy_state: tuple[float, float | None] = (0.0, None)
        self.trainer_version = 0
        self._thread = threading.Thread(target=self._run, name="tandemrl-rollout-worker", daemon=True)
        self._thread.start()

    def busy_s(self, now: float) -> float:
        """Seconds spent sampling from the start to ``now`` (a perf_counter reading), the busy period in progress
        included: a share of any window of wall time stays within [0, 1]."""
        done, since = self._busy_state
        return done + (max(now - since, 0.0) if since is not None else 0.0)

    def _busy(self, busy: bool) -> None:
        """The worker thread starts (True) or ends (False) a period of sampling."""
        done, since = self._busy_state
        now = time.perf_counter()
        if busy:
            self._busy_state = (done, now)
        elif since is not None:
            self._busy_state = (done + now - since, None)

    def submit(self, job: RolloutJob) -> None:
        self._jobs.put(job)

    def gone(self) -> str | None:
        """None while the thread runs; why it does not otherwise."""
        return None if self._thread.is_alive() else "the rollout worker thread ended"

    def stop(self) -> None:
        self._jobs.put(None)
        self.out.close()  # a put waiting for room returns
        self._thread.join(timeout=60)

    def _run(self) -> None:
        raise NotImplementedError
