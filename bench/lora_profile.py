"""Where a LoRA decode step's time goes (issue 37 point 3): per-kernel device time of one decode step of the model
without an adapter, then of the same model with a peft adapter on every linear layer, side by side.

python -m bench.lora_profile --arch qwen2.5-1.5b --batch 64 --lora-rank 64
python -m bench.lora_profile --arch qwen2.5-1.5b --batch 256 --grouped-adapters   # adapted q/k/v and gate/up in
    our grouped launches at every K above 64 rows too (the engine sends longer K there to cuBLAS + shrink + expand,
    and o_proj / down_proj at every size): the A/B of that rule

A step's share of a kernel: its device time over a run of 1 + --steps new tokens less that over a run of 1 (the
prefill and the first token), divided by --steps; calls the same way. Random bf16 weights, EOS ignored, CUDA graphs
as the engine runs them; the wall step time is measured the same way (synchronised runs).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from unittest import mock

import torch

from bench.engine_throughput import engine_run, random_prompts
from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.kernels import linear_dispatch
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.models.unwrap import unwrap_causal_lm


def kernel_times(backend: EngineBackend, prompts: list[list[int]], new_tokens: int) -> tuple[Counter, Counter]:
    """(device microseconds, launches) per kernel name over one engine run."""
    times, calls = Counter(), Counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine_run(backend, prompts, new_tokens)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.time_range.elapsed_us()
            calls[event.name] += 1
    return times, calls


def wall_s(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def per_step(model, args, seed: int) -> dict:
    """Per decode step: wall ms, device us and launches per kernel (the difference of two runs, see the doc)."""
    backend = EngineBackend(model, None, EngineConfig(num_blocks=4096, max_num_seqs=args.batch), device="cuda")
    vocab = unwrap_causal_lm(model).config.vocab_size
    prompts = [random_prompts(args.batch, args.prompt_len, vocab, seed=seed + i) for i in range(5)]
    engine_run(backend, prompts[0], 1 + args.steps)  # compiles and captures every graph of the shape
    short = wall_s(lambda: engine_run(backend, prompts[1], 1))
    long = wall_s(lambda: engine_run(backend, prompts[2], 1 + args.steps))
    (t1, c1), (tn, cn) = kernel_times(backend, prompts[3], 1), kernel_times(backend, prompts[4], 1 + args.steps)
    backend.close()
    names = set(t1) | set(tn)
    return {"step_ms": (long - short) / args.steps * 1e3,
            "kernels": {n: {"us": (tn[n] - t1[n]) / args.steps, "calls": (cn[n] - c1[n]) / args.steps}
                        for n in names}}


def grouped_everywhere():
    """Adapted projections through our grouped launches at any K (the plain ones keep the engine's rule)."""
    rule = linear_dispatch.grouped_launch_wins
    return mock.patch.object(linear_dispatch, "grouped_launch_wins",
                             lambda op, rows, k, adapted: adapted or rule(op, rows, k, adapted))


def table(plain: dict, lora: dict, rows: int) -> list[str]:
    """Markdown: the kernels taking the most LoRA time first, then the totals."""
    none = {"us": 0.0, "calls": 0.0}
    names = sorted(set(plain["kernels"]) | set(lora["kernels"]),
                   key=lambda n: -max(lora["kernels"].get(n, none)["us"], plain["kernels"].get(n, none)["us"]))
    lines = ["| kernel | plain us/step | calls | LoRA us/step | calls |", "| --- | --- | --- | --- | --- |"]
    for n in names[:rows]:
        p, q = plain["kernels"].get(n, none), lora["kernels"].get(n, none)
        lines.append(f"| {n[:90]} | {p['us']:.1f} | {p['calls']:.0f} | {q['us']:.1f} | {q['calls']:.0f} |")
    for label, key in (("device busy us/step", "us"), ("launches/step", "calls")):
        lines.append(f"| {label} | {sum(k[key] for k in plain['kernels'].values()):.0f} | | "
                     f"{sum(k[key] for k in lora['kernels'].values()):.0f} | |")
    lines.append(f"| wall step ms | {plain['step_ms']:.3f} | | {lora['step_ms']:.3f} "
                 f"({lora['step_ms'] / plain['step_ms']:.2f}x) | |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64, help="decode steps of the profiled run")
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--grouped-adapters", action="store_true",
                        help="adapted projections in our launches at every K (the A/B of the dispatch rule)")
    parser.add_argument("--rows", type=int, default=30, help="kernels in the printed table")
    parser.add_argument("--out", type=Path, default=Path("bench/out/lora_profile.json"))
    args = parser.parse_args(argv)
    model = build_model(args.arch, torch.device("cuda"), torch.bfloat16, gradient_checkpointing=False,
                        init_on_device=True).eval()
    plain = per_step(model, args, seed=0)
    model = apply_lora(model, LoraSettings(rank=args.lora_rank, alpha=2 * args.lora_rank)).eval()
    if args.grouped_adapters:
        with grouped_everywhere():
            lora = per_step(model, args, seed=10)
    else:
        lora = per_step(model, args, seed=10)
    lines = table(plain, lora, args.rows)
    print(f"{args.arch} batch {args.batch}, {args.prompt_len} + {args.steps}, LoRA rank {args.lora_rank}"
          f"{' (adapters grouped at every K)' if args.grouped_adapters else ''}, {torch.cuda.get_device_name()}")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "plain": plain,
                                    "lora": lora, "table": lines}, indent=2) + "\n")


if __name__ == "__main__":
    main()
