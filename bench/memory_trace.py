"""`tandemrl train` with its GPU memory traced (bench/gpu_qwen_train.sh's MEMORY_TRACE=1): where a run's memory goes.

Prints one `memory_trace` line per step: memory allocated after the rollout (when the update starts) and after the
update, the step's peak, and the update's forwards (count, largest rows x columns); records
torch.cuda.memory._record_memory_history over the first --steps steps and writes its snapshot to --snapshot after
them, or at an out-of-memory error, whichever comes first (open it at https://pytorch.org/memory_viz).

    python -m bench.memory_trace --snapshot $OUT/memory_snapshot.pickle -- train --config ... --set ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import tandemrl.train.loop as loop
from tandemrl.cli import main as cli_main
from tandemrl.models.unwrap import unwrap_causal_lm

GIB = 2**30


class MemoryTrace:
    def __init__(self, snapshot: Path, steps: int) -> None:
        self.snapshot, self.steps, self.step = snapshot, steps, 0
        self.forwards: list[tuple[int, int]] = []  # (rows, columns) of each decoder forward of this step's update
        self.hooked: set[int] = set()
        self.recording = False

    def start(self) -> None:
        if torch.cuda.is_available():  # a CPU run (the smoke test) prints the forwards alone
            torch.cuda.memory._record_memory_history(max_entries=200_000)
            self.recording = True

    def dump(self, why: str) -> None:
        if self.recording:
            self.snapshot.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(self.snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False
            print(f"memory_trace: snapshot {self.snapshot} ({why})", flush=True)

    def policy_update(self, model, *args, **kwargs):
        decoder = unwrap_causal_lm(model).get_decoder()
        if id(decoder) not in self.hooked:
            decoder.register_forward_pre_hook(self._count_forward, with_kwargs=True)
            self.hooked.add(id(decoder))
        before = torch.cuda.memory_allocated()
        result = original_update(model, *args, **kwargs)
        widest = max(self.forwards, key=lambda f: f[0] * f[1], default=(0, 0))
        print(f"memory_trace step {self.step + 1}: allocated after rollout {before / GIB:.2f} GiB, after update "
              f"{torch.cuda.memory_allocated() / GIB:.2f} GiB, peak {torch.cuda.max_memory_allocated() / GIB:.2f} "
              f"GiB; update forwards {len(self.forwards)}, largest {widest[0]} rows x {widest[1]} columns = "
              f"{widest[0] * widest[1]} positions", flush=True)
        self.forwards.clear()
        return result

    def _count_forward(self, _module, _args, kwargs) -> None:
        if torch.is_grad_enabled():
            self.forwards.append(tuple(kwargs["input_ids"].shape))

    def train_step(self, *args, **kwargs):
        try:
            metrics = original_step(*args, **kwargs)
        except torch.OutOfMemoryError:
            self.dump("out of memory")
            raise
        self.step += 1
        if self.step >= self.steps:
            self.dump(f"after {self.step} steps")
        return metrics


original_update, original_step = loop.policy_update, loop.train_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snapshot", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=5, help="steps recorded in the snapshot")
    parser.add_argument("cli", nargs=argparse.REMAINDER, help="-- then tandemrl's command line")
    args = parser.parse_args(argv)
    trace = MemoryTrace(args.snapshot, args.steps)
    loop.policy_update, loop.train_step = trace.policy_update, trace.train_step
    trace.start()
    try:
        return cli_main(args.cli[1:] if args.cli[:1] == ["--"] else args.cli)
    finally:
        trace.dump("end of run")
        loop.policy_update, loop.train_step = original_update, original_step


if __name__ == "__main__":
    sys.exit(main())
