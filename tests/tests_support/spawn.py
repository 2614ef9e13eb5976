"""Start a test's gloo ranks with torch.multiprocessing, once more if a rank died by SIGABRT.

Gloo's TCP transport can abort a process from its own I/O thread when a peer's connection resets under load
(std::terminate in gloo::transport::tcp, pytorch/gloo#514): on CI's 2 shared cores it killed rank 0 of a test that
passes on every other run. Such a death says nothing about the code under test, so the ranks run again once, on a
fresh store. A rank that raises, or results that differ, still fail the test: only a death by SIGABRT is retried.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch.multiprocessing as mp


def spawn_ranks(fn: Callable, args: tuple, nprocs: int, store: Path) -> None:
    """``mp.spawn(fn, args, nprocs)``; ``store`` is the FileStore path in ``args``, removed before a second try."""
    try:
        mp.spawn(fn, args=args, nprocs=nprocs, join=True)
    except mp.ProcessExitedException as death:
        if death.signal_name != "SIGABRT":
            raise
        warnings.warn(f"rank {death.error_index} aborted (SIGABRT, gloo's transport): running the ranks again")
        store.unlink(missing_ok=True)
        mp.spawn(fn, args=args, nprocs=nprocs, join=True)
