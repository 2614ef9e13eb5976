"""Ctrl-C during training: the first one lets the current step finish, then the run saves and stops; a second one
stops at once (the last checkpoint on disk stays the last good one)."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class GracefulInterrupt:
    def __init__(self) -> None:
        self.requested = False
        self._previous: signal.Handlers | None = None

    def __enter__(self) -> GracefulInterrupt:
        # Signal handlers can only be installed from the main thread; elsewhere Ctrl-C keeps its default.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
