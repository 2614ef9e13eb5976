"""Tandem GRPO step against the vanilla one, in one run: Qwen3-0.6B architecture (random bf16 weights) for the hot
model and its frozen copy, 8 prompts x 8 samples x 512 tokens, EOS ignored, one GRPO update per step.

Prints, per setting, the median step (rollout + update), its ratio to vanilla, rollout tokens/s and the forward
passes each model ran per kept token (batched passes over the step's rows / tokens per sequence); then, from one more
step per setting watched with CUDA events (bench/device_busy.py), each model's device busy time in its forwards and
lm_heads against the rollout's wall time (two GPUs at work together: each near the wall time; in turn: their sum),
and the host's time launching and waiting. The seed (llm-tandem-verl, 2x A100, Qwen3-0.6B): vanilla 18.6 s, tandem
33.5 s per step (1.8x).

GPU:  python -m bench.tandem_step
      python -m bench.tandem_step --sync-too              # each tandem setting also with async scheduling off (A/B)
      python -m bench.tandem_step --turns-too             # each tandem setting also in turns on one stream (A/B)
      python -m bench.tandem_step --rounds-too            # each tandem setting also as verify rounds (issue 35)
      python -m bench.tandem_step --frozen-device cuda:1   # the frozen model on a second GPU (tandem.frozen_device)
CPU:  python -m bench.tandem_step --arch tiny-qwen3 --new-tokens 16 --prompt-len 8 --repeats 1 --sync-too
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
from datetime import date
from pathlib import Path

import torch

from bench.collections_watch import FullCollections, release_garbage
from bench.device_busy import DeviceBusy
from bench.grpo_step import add_step_shape_args, build_model, one_step
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.config import TrainConfig
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.model.cuda_graphs import DecodeGraphs
from tandemrl.engine.step import TARGET
from tandemrl.engine.tandem import FROZEN
from tandemrl.tandem.config import TandemConfig
from tandemrl.train.optim import build_optimizer, build_scheduler


class CaptureCounter:
    """Counts the engine's CUDA graph captures from its creation on (after the warm-up steps a rollout should
    capture none: the graphs parked over the update's sleep serve again)."""

    def __init__(self) -> None:
        self.count = 0
        capture = DecodeGraphs.capture

        def counted(graphs: DecodeGraphs, body):
            self.count += 1
            return capture(graphs, body)

        DecodeGraphs.capture = counted


def measure(model, frozen, tandem: TandemConfig | None, args, device: torch.device, captures: CaptureCounter,
            collections: FullCollections, async_scheduling: bool = True, turns: bool = False,
            rounds: bool = False) -> dict:
    config = EngineConfig(num_blocks=args.num_blocks, async_scheduling=async_scheduling)
    backend = EngineBackend(model, None, config, device=device, tandem=tandem,
                            frozen_model=frozen if tandem is not None else None)
    if turns:  # the A/B of paired ticks: bursts in turns on one stream, as off a GPU
        backend.engine.scheduler.paired_tandem = False
    if rounds:  # the A/B of bursts (issue 35): each step a verify round per row (frozen run, then a hot token)
        scheduler = backend.engine.scheduler
        scheduler.tandem = dataclasses.replace(scheduler.tandem, drawn_ahead=False)
        backend.engine._synchronous = True  # what a round keeps decides where the next starts
    cfg = TrainConfig(lr=1e-6, micro_batch_size=args.micro_batch, max_steps=args.repeats + 3)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    def timed_step(seed: int):  # each step's times as it ends: a slow setting shows where before any timeout
        before = captures.count
        timing = one_step(model, backend, optimizer, scheduler, cfg, args, device, seed=seed)
        print(f"  step (seed {seed}, tandem {tandem is not None}, async {async_scheduling}): rollout "
              f"{timing.rollout_s:.2f} s, update {timing.train_s:.2f} s (wake {timing.wake_s:.3f} s), "
              f"{captures.count - before} graph captures, {collections.take()}", flush=True)
        return timing

    # two warm-up steps at full shape: the first update allocates the optimizer state, maybe where the KV pools were,
    # so the second rollout may capture its graphs again; from the third on they serve from one update to the next
    timed_step(1000)
    timed_step(1001)
    slots = backend.runner.slots
    before = {name: slot.stats.forwards for name, slot in slots.items()}
    runs = [timed_step(s) for s in range(args.repeats)]
    passes = {name: (slots[name].stats.forwards - before[name]) / (args.repeats * args.new_tokens) for name in slots}
    busy = DeviceBusy()  # one more step, not among the timed ones: its events cost a little
    with busy.watching():
        watched = timed_step(args.repeats)
    busy_report = busy.report(watched.rollout_s)
    print(f"  busy: {busy_line(busy_report)}", flush=True)
    backend.close()
    release_garbage(device)  # what this setting left (engine, optimizer state) is gone before the next one is timed
    median = sorted(runs, key=lambda t: t.rollout_s + t.train_s)[len(runs) // 2]
    return {"step_s": median.rollout_s + median.train_s, "rollout_s": median.rollout_s, "train_s": median.train_s,
            "rollout_tok_s": median.tokens / median.rollout_s, "peak_gib": median.peak_gib,
            "hot_passes_per_token": passes[TARGET], "frozen_passes_per_token": passes.get(FROZEN, 0.0),
            "busy": busy_report}


def busy_line(busy: dict) -> str:
    """A watched rollout in one line: per slot its device's busy seconds (share of the wall time, ms per call), and
    the host's seconds launching and reading back."""
    slots = [f"{name} {r['busy_s']:.2f} s ({r['busy_share']:.0%}, {1000 * r['busy_s'] / r['calls']:.2f} ms x "
             f"{r['calls']})" for name, r in busy.items() if isinstance(r, dict)]
    return (f"wall {busy['wall_s']:.2f} s; device busy in forwards + lm_heads: {', '.join(slots) or '-'}; host "
            f"launching {busy['launch_s']:.2f} s, reading back (waiting) {busy['wait_s']:.2f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_shape_args(parser, arch="qwen3-0.6b", repeats=5)
    parser.add_argument("--ps", type=float, nargs="+", default=[0.5, 0.8])
    parser.add_argument("--max-run-tokens", type=int, default=3, help="frozen tokens per step (64 x 4 rows: graphs)")
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--frozen-device", default=None, help="where the frozen model lives (default: the hot's)")
    parser.add_argument("--rounds-too", action="store_true",
                        help="each tandem setting also as verify rounds (frozen proposer, forced rule), not bursts")
    parser.add_argument("--sync-too", action="store_true",
                        help="also time each tandem setting with engine.async_scheduling off (rows 'tandem p=P sync')")
    parser.add_argument("--turns-too", action="store_true",
                        help="also time each tandem setting in turns on one stream (rows 'tandem p=P turns')")
    parser.add_argument("--out", type=Path, default=Path("bench/out/tandem_step.json"))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, False)
    frozen = copy.deepcopy(model).to(args.frozen_device or device).eval().requires_grad_(False)
    captures, collections = CaptureCounter(), FullCollections()
    rows = {"vanilla": measure(model, None, None, args, device, captures, collections)}
    print(f"vanilla: {rows['vanilla']}", flush=True)  # as each row is measured: a timeout keeps what was done
    for p in args.ps:
        tandem = TandemConfig(enabled=True, p=p, max_run_tokens=args.max_run_tokens)
        settings = [(f"tandem p={p}", True, False, False)]
        settings += [(f"tandem p={p} sync", False, False, False)] if args.sync_too else []
        settings += [(f"tandem p={p} turns", True, True, False)] if args.turns_too else []
        settings += [(f"tandem p={p} rounds", False, False, True)] if args.rounds_too else []
        for name, async_scheduling, turns, rounds in settings:
            rows[name] = measure(model, frozen, tandem, args, device, captures, collections,
                                 async_scheduling=async_scheduling, turns=turns, rounds=rounds)
            print(f"{name}: step / vanilla {rows[name]['step_s'] / rows['vanilla']['step_s']:.2f}, {rows[name]}",
                  flush=True)
    result = {"date": date.today().isoformat(), "torch": torch.__version__, "arch": args.arch,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "shape": f"{args.prompts}x{args.group}x{args.new_tokens}",
              "frozen_device": str(next(frozen.parameters()).device), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    vanilla = rows["vanilla"]["step_s"]
    print("| setting | step s | / vanilla | rollout s | update s | rollout tok/s | hot passes/token | "
          "frozen passes/token |")
    for name, r in rows.items():
        print(f"| {name} | {r['step_s']:.2f} | {r['step_s'] / vanilla:.2f} | {r['rollout_s']:.2f} | {r['train_s']:.2f} "
              f"| {r['rollout_tok_s']:.0f} | {r['hot_passes_per_token']:.2f} | {r['frozen_passes_per_token']:.2f} |")
    print("| the seed (llm-tandem-verl, 2x A100): vanilla 18.6 s, tandem 33.5 s | 33.5 | 1.80 | - | - | - | 1 | 1 |")
    for name, r in rows.items():  # one more rollout per setting, watched with CUDA events (bench/device_busy.py)
        print(f"busy, {name}: {busy_line(r['busy'])}")


if __name__ == "__main__":
    main()
