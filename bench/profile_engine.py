"""Where a decode step's time goes: cProfile of the host side and torch.profiler of the device side.

python -m bench.profile_engine --arch qwen2.5-0.5b --batch 64
python -m bench.profile_engine --arch qwen3-0.6b --batch 64 --tandem 0.5   # a tandem rollout (frozen: a copy)
python -m bench.profile_engine --arch qwen3-0.6b --batch 64 --tandem 0.5 --sync   # the same, async scheduling off
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats

import torch

from bench.engine_throughput import engine_run, random_prompts
from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.tandem.config import TandemConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--fresh-prompts", action="store_true",
                        help="new prompts for every run, so the prefix cache never serves them (profiles prefill)")
    parser.add_argument("--tandem", type=float, default=None, metavar="P",
                        help="profile a tandem rollout (Bernoulli p = P; the frozen model a copy of the hot one)")
    parser.add_argument("--sync", action="store_true", help="engine.async_scheduling off (the A/B of the GPU gaps)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False).eval()
    tandem = TandemConfig(enabled=True, p=args.tandem) if args.tandem is not None else None
    frozen = copy.deepcopy(model) if tandem is not None else None
    config = EngineConfig(num_blocks=4096, async_scheduling=not args.sync)
    backend = EngineBackend(model, None, config, device=device, tandem=tandem, frozen_model=frozen)
    runs = iter(range(1 << 30))

    def prompts() -> list[list[int]]:
        seed = next(runs) if args.fresh_prompts else 0
        return random_prompts(args.batch, args.prompt_len, model.config.vocab_size, seed=seed)

    engine_run(backend, prompts(), args.new_tokens)  # warm-up and graph capture
    profile = cProfile.Profile()
    profile.enable()
    engine_run(backend, prompts(), args.new_tokens)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        engine_run(backend, prompts(), args.new_tokens)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60))
    if device.type == "cuda":
        print_idle_gaps(prof)


def print_idle_gaps(prof) -> None:
    """How much of the run the GPU sat idle, and the longest idle gaps with the kernel that preceded each."""
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    if not kernels:
        return
    busy, gaps, end = 0.0, [], kernels[0][0]
    last = kernels[0][2]
    for start, stop, name in kernels:
        if start > end:
            gaps.append((start - end, last))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, last = stop, name
    span = end - kernels[0][0]
    print(f"GPU busy {busy / 1e3:.1f} ms of {span / 1e3:.1f} ms ({busy / span:.1%}); idle gaps > 20 us: "
          f"{sum(g for g, _ in gaps if g > 20) / 1e3:.1f} ms in {sum(g > 20 for g, _ in gaps)}")
    for gap, name in sorted(gaps, reverse=True)[:12]:
        print(f"  {gap:8.0f} us after {name[:80]}")


if __name__ == "__main__":
    main()
