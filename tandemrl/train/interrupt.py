"""Ctrl-C or SIGTERM during training: the first one lets the current step finish, then the run saves and stops; a
second one stops at once (the last checkpoint on disk stays the last good one). SIGTERM is what SLURM and
Kubernetes send before killing a job, so it gets the same save-and-stop as Ctrl-C."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulInterrupt:
    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None  # e.g. "SIGTERM", for the message after the save
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulInterrupt:
        # Signal handlers can only be installed from the main thread; elsewhere the signals keep their defaults.
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            if previous is not None:  # None: the old handler was not set from Python and cannot be put back
                signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
