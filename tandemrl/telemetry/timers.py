"""Wall-clock timers that account for asynchronous CUDA work, and peak-memory probes."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Timer", "StepTimes", "peak_memory_gb", "reset_peak_memory", "cuda_in_use"]

_GIB = float(1 << 30)


def cuda_in_use() -> bool:
    """True when torch is imported and has initialised CUDA in this process (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken driver should not break timing
        return False


def _sync() -> None:
    if cuda_in_use():
        import torch

        torch.cuda.synchronize()


class Timer:
    """``with Timer() as t: ...`` then ``t.elapsed`` (seconds).

    When CUDA is in use the device is synchronised on entry and exit, so queued kernels are
    counted in the block that launched them. ``sync=False`` turns that off; ``sync=True`` forces it.
    """

    def __init__(self, sync: bool | None = None) -> None:
        self.sync = sync
        self.elapsed: float = 0.0
        self._start: float | None = None

    def _maybe_sync(self) -> None:
        if self.sync is None:
            _sync()
        elif self.sync:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()

    def __enter__(self) -> Timer:
        self._maybe_sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._maybe_sync()
        assert self._start is not None
        self.elapsed = time.perf_counter() - self._start


class StepTimes:
    """Named durations for one step, reported as ``time/<name>`` metrics.

    Measuring the same name twice in a step adds the durations.
    """

    def __init__(self, sync: bool | None = None) -> None:
        self.sync = sync
        self.durations: dict[str, float] = {}

    @contextmanager
    def measure(self, name: str, sync: bool | None = None) -> Iterator[Timer]:
        """``sync``: this block's own setting (False: host work, no device synchronisation); None: the default."""
        timer = Timer(sync=self.sync if sync is None else sync)
        with timer:
            yield timer
        self.add(name, timer.elapsed)

    def add(self, name: str, seconds: float) -> None:
        self.durations[name] = self.durations.get(name, 0.0) + float(seconds)

    def metrics(self) -> dict[str, float]:
        return {f"time/{name}": secs for name, secs in self.durations.items()}

    def reset(self) -> None:
        self.durations.clear()

    def pop_metrics(self) -> dict[str, float]:
        """The metrics so far, then reset for the next step."""
        out = self.metrics()
        self.reset()
        return out


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    dev_type = getattr(device, "type", None)
    if dev_type is None:
        dev_type = str(device).split(":", 1)[0]
    return dev_type == "cuda"


def peak_memory_gb(device: Any) -> float:
    """Peak memory in GiB: ``torch.cuda.max_memory_allocated`` on CUDA, process peak RSS otherwise."""
    if _is_cuda(device):
        import torch

        return torch.cuda.max_memory_allocated(device) / _GIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    return rss_bytes / _GIB


def reset_peak_memory(device: Any) -> None:
    """Reset the CUDA peak counter. On CPU the process peak RSS cannot be reset; this is a no-op."""
    if _is_cuda(device):
        import torch

        torch.cuda.reset_peak_memory_stats(device)
