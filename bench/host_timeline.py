"""Where the host's time goes in an engine run, without a profiler's overhead: named functions are wrapped with
perf_counter accumulators (inclusive times, so nested entries overlap) for the length of a ``with`` block.

    with HostTimeline(SPECULATIVE) as timeline:
        engine.generate(requests)
    timeline.print(steps=engine_steps)
"""

from __future__ import annotations

import functools
import importlib
import time
from typing import Any

# "module:attribute[.attribute]" of the functions a speculative (verify) step calls on the host
SPECULATIVE = (
    "tandemrl.engine.engine:LLMEngine._step",
    "tandemrl.engine.scheduler:Scheduler.schedule",
    "tandemrl.engine.scheduler:Scheduler.postprocess",
    "tandemrl.engine.model.runner:ModelRunner.launch",
    "tandemrl.engine.model.runner:launch_rounds",
    "tandemrl.engine.model.round:RoundRows.columns",
    "tandemrl.engine.model.proposers:ModelProposer.propose",
    "tandemrl.engine.model.rounds:_compact",
    "tandemrl.engine.model.proposers:ModelProposer.distributions",
    "tandemrl.engine.model.slot:ModelSlot.logits",
    "tandemrl.engine.model.cuda_graphs:DecodeGraphs.run_columns",
    "tandemrl.engine.model.cuda_graphs:DecodeGraphs._replay",
    "tandemrl.engine.model.step_sampler:StepSampler.for_subsets",
    "tandemrl.engine.model.pending:PendingTokens.__init__",
    "tandemrl.engine.model.pending:PendingTokens.result",
)
TANDEM = (
    "tandemrl.engine.engine:LLMEngine._step",
    "tandemrl.engine.scheduler:Scheduler.schedule",
    "tandemrl.engine.scheduler:Scheduler.postprocess",
    "tandemrl.engine.model.runner:ModelRunner.launch",
    "tandemrl.engine.scheduler:plan_tandem_burst",
    "tandemrl.engine.model.tandem_runner:build_decode_plan",
    "tandemrl.engine.model.tandem_runner:_device_indices",
    "tandemrl.engine.model.tandem_runner:_staged_forwards",
    "tandemrl.engine.model.tandem_runner:_score",
    "tandemrl.engine.model.slot:ModelSlot.logits",
    "tandemrl.engine.model.cuda_graphs:DecodeGraphs._replay",
    "tandemrl.engine.model.pending:PendingTokens.__init__",
    "tandemrl.engine.model.pending:PendingTokens.result",
)


class HostTimeline:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.totals = {name: [0, 0.0] for name in names}  # name -> [calls, seconds]
        self._restore: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> HostTimeline:
        for name in self.names:
            module, path = name.split(":")
            owner: Any = importlib.import_module(module)
            *parents, attr = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            setattr(owner, attr, self._timed(name, original))
            self._restore.append((owner, attr, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._restore):
            setattr(owner, attr, original)

    def _timed(self, name: str, fn: Any) -> Any:
        total = self.totals[name]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total[0] += 1
                total[1] += time.perf_counter() - start
        return wrapper

    def print(self, steps: int) -> None:
        print(f"host time per engine step ({steps} steps; inclusive, nested entries overlap):")
        for name, (calls, seconds) in self.totals.items():
            print(f"  {name.split(':')[1]:42s} {calls / steps:6.1f} calls {seconds / steps * 1e3:8.3f} ms")
