"""Each rank's heartbeat in torchrun's store, and a watchdog that ends the job when another rank's stops.

A rank that exits is seen by torchrun's agent, which stops the others. A rank that is frozen (a stopped or swapped-out
process, a GPU fault that holds the interpreter, a node cut off from the network) is not: the others would wait in
their next collective until distributed.timeout_s, which must be long (rank 0 writes a checkpoint's full weights
alone). The heartbeat separates the two cases: a thread in every rank bumps a counter in the store every few seconds
and watches the others'; a counter that stops moving for distributed.heartbeat_timeout_s ends this process with a
message naming that rank (its host and pid) and a non-zero status, and torchrun then stops the rest. Counters, not
clocks: nodes' clocks need not agree; each watcher times the others on its own monotonic clock.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

EXIT_STATUS = 75  # the watchdog's own exit status, told apart from a crash's
BEATS_PER_TIMEOUT = 6
DONE = "done"  # a rank that left cleanly: its silence is no failure


@dataclass
class Heartbeat:
    store: object  # a torch.distributed Store (a client of torchrun's)
    rank: int
    world_size: int
    timeout_s: float
    exit: Callable[[int], None] = os._exit  # tests swap it; a rank in a collective cannot be interrupted otherwise
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> Heartbeat:
        self.store.set(f"who/{self.rank}", f"{socket.gethostname()} pid {os.getpid()}")
        self.store.set(f"beat/{self.rank}", "0")
        self._thread = threading.Thread(target=self._run, name="tandemrl-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """A clean exit: the others stop watching this rank."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.store.set(f"beat/{self.rank}", DONE)
        except Exception:  # the store's host may be gone already at the very end of a job
            pass

    def _run(self) -> None:
        interval = self.timeout_s / BEATS_PER_TIMEOUT
        others = [r for r in range(self.world_size) if r != self.rank]
        last_seen = {r: ("", time.monotonic()) for r in others}
        count = 0
        while not self._stop.wait(interval):
            count += 1
            try:
                self.store.set(f"beat/{self.rank}", str(count))
                values = {r: self._read(f"beat/{r}") for r in others}
            except Exception as exc:  # the store lives with torchrun's agent on the first node
                return self._fail(f"torchrun's store is unreachable ({exc}): the first node or its agent is gone")
            now = time.monotonic()
            for r, value in values.items():
                if value == DONE:
                    continue
                if value != last_seen[r][0]:
                    last_seen[r] = (value, now)
                elif now - last_seen[r][1] > self.timeout_s:
                    return self._fail(self._silent(r, now - last_seen[r][1]))

    def _read(self, key: str) -> str:
        """The key's value; "" until its rank has written it (a get would block)."""
        return self.store.get(key).decode() if self.store.check([key]) else ""

    def _silent(self, rank: int, seconds: float) -> str:
        try:
            who = self._read(f"who/{rank}") or "host unknown: it never beat"
        except Exception:
            who = "host unknown"
        return (f"rank {rank} ({who}) has not beaten for {seconds:.0f} s (distributed.heartbeat_timeout_s = "
                f"{self.timeout_s:g}): it died, hangs or is cut off; ending the job. The last complete checkpoint "
                "is intact: resume with --resume")

    def _fail(self, message: str) -> None:
        print(f"[rank {self.rank}] tandemrl: {message}", file=sys.stderr, flush=True)
        self.exit(EXIT_STATUS)


def torchrun_store(timeout_s: float) -> object | None:
    """A client of the store torchrun's agent serves (MASTER_ADDR:MASTER_PORT), prefixed for tandemrl's keys; None
    where there is none (a process group set up by hand)."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port or not os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return dist.PrefixStore(f"tandemrl/heartbeat/{os.environ['TORCHELASTIC_RUN_ID']}/", store)
