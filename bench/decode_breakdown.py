"""Where one decode step's time goes, per batch size: the captured forward alone (graph replays timed with
events), lm_head + sampling, and the runner's whole step with its host work (synchronised).

python -m bench.decode_breakdown --arch qwen2.5-0.5b --batches 1 8 64 256
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.engine_throughput import decode_floor_s, measured_bandwidth, random_prompts
from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.sequence import Sequence
from tandemrl.types import SamplingParams


def event_ms(fn, repeats: int) -> float:
    """Median milliseconds of `fn` over `repeats` runs, timed with CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def wall_ms(fn, repeats: int) -> float:
    """Mean wall-clock milliseconds of `fn`, host work included (synchronised before and after)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def prefilled(runner: ModelRunner, prompts: list[list[int]], block_size: int) -> list[Sequence]:
    """Sequences holding contiguous blocks for prompt + 1024 tokens, prefilled once."""
    seqs, next_block = [], 0
    per_seq = -(-(len(prompts[0]) + 1024) // block_size)
    for i, prompt in enumerate(prompts):
        seq = Sequence(i, str(i), list(prompt), len(prompt), SamplingParams(max_tokens=1024, temperature=1.0))
        seq.block_table = list(range(next_block, next_block + per_seq))
        next_block += per_seq
        seqs.append(seq)
    tokens, logprobs = runner.run(seqs, True)
    for seq, t, lp in zip(seqs, tokens, logprobs):
        seq.append_token(t, lp)
    return seqs


def profile_forward(runner: ModelRunner, seqs: list[Sequence]) -> None:
    """Kernels of one eager decode step (what the graph replays), by total device time."""
    runner.target.enforce_eager = True
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        runner.run(seqs, False)
        torch.cuda.synchronize()
    runner.target.enforce_eager = False
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=384, help="context at the timed steps (the mean "
                        "context of 128 prompt + 512 new tokens)")
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("bench/out/decode_breakdown.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    model = build_model(args.arch, device, torch.bfloat16, gradient_checkpointing=False).eval()
    bandwidth = measured_bandwidth(device)
    rows = []
    for batch in args.batches:
        runner = ModelRunner(model, EngineConfig(block_size=16), device)
        runner.allocate_kv_cache(batch * (-(-(args.prompt_len + 1024) // 16)))
        seqs = prefilled(runner, random_prompts(batch, args.prompt_len, model.config.vocab_size, batch), 16)
        for _ in range(3):
            runner.run(seqs, False)  # capture and warm up; the same position is rewritten each time
        torch.cuda.synchronize()
        graph, out = next(iter(runner.target.graphs.graphs.values()))
        forward_ms = event_ms(graph.replay, 50)
        hidden = out[:batch]
        with torch.inference_mode():
            sample = runner.sampler.for_subsets(seqs)
            sample_ms = event_ms(lambda: sample(runner.target.logits(hidden), slice(None)), 50)
        step_ms = wall_ms(lambda: runner.run(seqs, False), 50)
        burst_ms = wall_ms(lambda: runner.decode(seqs, [args.decode_steps] * batch), 10) / args.decode_steps
        floor_ms = decode_floor_s(model, batch, args.prompt_len, 0, bandwidth) * 1e3
        rows.append({"batch": batch, "forward_graph_ms": forward_ms, "lm_head_sample_ms": sample_ms,
                     "single_step_ms": step_ms, "burst_step_ms": burst_ms, "floor_ms": floor_ms})
        print(f"batch {batch}: forward graph {forward_ms:.3f} ms, lm_head+sample {sample_ms:.3f} ms, "
              f"one step {step_ms:.3f} ms, per step of a {args.decode_steps}-step burst {burst_ms:.3f} ms, "
              f"floor {floor_ms:.3f} ms (burst/floor {burst_ms / floor_ms:.2f})", flush=True)
        if batch in (args.batches[0], args.batches[-1]):
            profile_forward(runner, seqs)
        runner.free_kv_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "bandwidth_gb_s": bandwidth / 1e9,
                                    "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
