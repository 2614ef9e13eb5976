"""Python's full garbage collections during a benchmark: each walks every tracked object, so with models and engines
alive one can take tens of milliseconds, the size of the effects a short timed run looks for."""

from __future__ import annotations

import gc
import time

import torch


class FullCollections:
    """Python's full garbage collections and their time, since last asked."""

    def __init__(self) -> None:
        self.count, self.seconds, self._start = 0, 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._start

    def take(self) -> str:
        said = f"{self.count} full collections ({self.seconds:.3f} s)"
        self.count, self.seconds = 0, 0.0
        return said


def release_garbage(device: torch.device) -> None:
    """Frees what a finished setting left (engines in reference cycles, their KV caches and CUDA graphs) before the
    next one is timed: left to the collector, it would be walked, and freed, inside a later timed run."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
