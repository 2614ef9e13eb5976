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
        self._busy_done_s = 0.0  # seconds spent sampling, since the start, up to the current busy period
        self._busy_since: float | None = None  # when the current busy period began (None: idle)
        self.trainer_version = 0
        self._thread = threading.Thread(target=self._run, name="tandemrl-rollout-worker", daemon=True)
        self._thread.start()

    def busy_s(self, now: float) -> float:
        """Seconds spent sampling from the start to ``now`` (a perf_counter reading), the busy period in progress
        included: a share of any window of wall time stays within [0, 1]."""
        since = self._busy_since
        return self._busy_done_s + (max(now - since, 0.0) if since is not None else 0.0)

    def _busy(self, busy: bool) -> None:
        """The worker thread starts (True) or ends (False) a period of sampling."""
        now = time.perf_counter()
        if busy:
            self._busy_since = now
        elif self._busy_since is not None:
            self._busy_done_s += now - self._busy_since
            self._busy_since = None

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
