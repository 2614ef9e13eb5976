"""Where a rollout's time goes, per device and on the host, from CUDA events (no profiler): for each model slot the
time its device spends in the slot's forwards (graph replays with their staging copies) and lm_heads; on the host
the time spent launching steps and the time blocked reading a step's tokens back (mostly waiting for the devices).

Two slots on two GPUs that work at once are each busy for most of the rollout's wall time; two that take turns add
up to it. A host that launches slower than the devices compute shows a small wait and idle devices.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Callable, Iterator

import torch

from tandemrl.engine.model.pending import PendingTokens
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.model.slot import ModelSlot


class DeviceBusy:
    """Collects, while ``watching()``, event pairs around every forward and lm_head of each slot, and the host's
    time in ``ModelRunner.launch`` and ``PendingTokens.result``; ``report`` sums them."""

    def __init__(self) -> None:
        self.marks: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = defaultdict(list)
        self.host = {"launch_s": 0.0, "wait_s": 0.0}

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        forwards, steps, logits = ModelSlot.decode_forwards, ModelSlot.decode_steps, ModelSlot.logits
        launch, result = ModelRunner.launch, PendingTokens.result

        def timed_forwards(slot, plans):
            run = forwards(slot, plans)
            return lambda f, ids: self._timed(slot, lambda: run(f, ids))

        def timed_steps(slot, plan):
            run, staged = steps(slot, plan)
            return (lambda j, ids: self._timed(slot, lambda: run(j, ids))), staged

        patches = {(ModelSlot, "decode_forwards"): timed_forwards, (ModelSlot, "decode_steps"): timed_steps,
                   (ModelSlot, "logits"): lambda slot, hidden: self._timed(slot, lambda: logits(slot, hidden)),
                   (ModelRunner, "launch"): self._host("launch_s", launch),
                   (PendingTokens, "result"): self._host("wait_s", result)}
        originals = {key: getattr(*key) for key in patches}
        for (owner, name), patched in patches.items():
            setattr(owner, name, patched)
        try:
            yield
        finally:
            for (owner, name), original in originals.items():
                setattr(owner, name, original)

    def _timed(self, slot: ModelSlot, call: Callable):
        """``call()``, between two events on the stream the slot's work goes to now (a side stream included)."""
        if slot.device.type != "cuda" or torch.cuda.is_current_stream_capturing():  # a verify round's graph
            return call()
        with torch.cuda.device(slot.device):
            stream = torch.cuda.current_stream()
            start = stream.record_event(torch.cuda.Event(enable_timing=True))
            out = call()
            self.marks[slot.name].append((start, stream.record_event(torch.cuda.Event(enable_timing=True))))
        return out

    def _host(self, key: str, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.host[key] += time.perf_counter() - start
        return timed

    def report(self, wall_s: float) -> dict:
        """Per slot its device's busy seconds in forwards and lm_heads, its count of them, and busy / wall; the host's
        seconds launching and reading back, all for a rollout of ``wall_s`` seconds."""
        out: dict = {"wall_s": wall_s, **self.host}
        for name, marks in self.marks.items():
            for _, end in marks:  # a slot's work may go to two streams (one GPU's paired ticks)
                end.synchronize()
            busy = sum(start.elapsed_time(end) for start, end in marks) / 1000
            out[name] = {"busy_s": busy, "calls": len(marks), "busy_share": busy / wall_s}
        return out
