"""Where a decode step's time goes, one engine against its tensor-parallel shard (issue 41): torch.profiler over
two runs per shape, differenced as bench/tp_decode.py differences its timings.

Per (batch, prompt) shape: a run of the prompt and one token (prefill alone) and one of the prompt and ``steps`` + 1
tokens (prefill and ``steps`` decode steps), fresh prompts each (no prefix-cache hit), first without the profiler
(the step's true wall time), then both profiled. Every figure is (long run - short run) / steps, per decode step:
device time by category (kernel names matched in ``CATEGORIES``; on CPU the ops' self time), kernels, the sum of
kernel times, the time the device was busy (kernels on several streams overlap: their union) and the profiled wall
time, so wall - busy is the device's idle time per step (gaps between kernels inside a graph replay, and host work
between replays and bursts); the top kernels by time. Also the idle gaps over 20 us with the kernel each followed
(long run only, not differenced).

Run by bench/tp_decode.py --profile DIR (rank 0's engine alone, then every rank's shard).
"""

from __future__ import annotations

import gzip
import re
import shutil
from collections import Counter
from pathlib import Path

import torch

from bench.engine_throughput import random_prompts, timed

# (category, pattern over the lower-cased kernel / op name): the first match wins, so the order matters
CATEGORIES = (
    ("all-reduce/nccl", r"nccl|all_?reduce|all_?gather|c10d|gloo"),
    ("attention", r"attention|attn|paged_decode|paged_prefill|combine_splits|flash|sdpa|fmha|_grouped_decode"),
    ("sampling", r"_partials_kernel|_draw_kernel|_score_kernel|softmax|topk|sort|argmax|exponential|multinomial"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|matmul|aten::mm|aten::addmm|aten::bmm|aten::linear|_grouped_linear|"
             r"_gate_up_silu"),
    ("norm", r"norm|rsqrt"),
    ("rotary/kv store", r"rope|rotary|store_kv|index_put|aten::cos|aten::sin"),
    ("copy/memset", r"memcpy|memset|copy|aten::fill|aten::cat|aten::stack|aten::clone|contiguous"),
    ("elementwise", r"elementwise|vectorized|unrolled|silu|aten::add|aten::mul|aten::sub|aten::div|aten::neg|"
                    r"aten::where|masked_fill|embedding|index|clamp|reduce_kernel"),
)
GAP_US = 20.0
TRACE_MAX_BYTES = 15 * 2**20  # a device call brings back files of 16 MiB at most


def category(name: str) -> str:
    lowered = name.lower()
    return next((c for c, pattern in CATEGORIES if re.search(pattern, lowered)), "other")


def device_events(prof: torch.profiler.profile, on_cuda: bool) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of every kernel, copy and memset on the device; on CPU every op, its self
    time as duration (no double count of nested ops)."""
    events = prof.events()
    if on_cuda:
        cuda = torch.autograd.DeviceType.CUDA
        return [(e.time_range.start, e.time_range.end - e.time_range.start, e.name) for e in events
                if e.device_type == cuda]
    return [(e.time_range.start, float(e.self_cpu_time_total), e.name) for e in events]


def busy_and_gaps(kernels: list[tuple[float, float, str]]) -> tuple[float, list[tuple[float, str]]]:
    """The union of the kernels' intervals (us), and the idle gaps between them with the kernel before each."""
    busy, gaps, end, last = 0.0, [], None, ""
    for start, duration, name in sorted(kernels):
        stop = start + duration
        if end is not None and start > end:
            gaps.append((start - end, last))
        busy += max(0.0, stop - max(start, end if end is not None else start))
        if end is None or stop > end:
            end, last = stop, name
    return busy, gaps


def summarize(kernels: list[tuple[float, float, str]], wall_s: float) -> dict:
    busy, gaps = busy_and_gaps(kernels)
    by_name, by_category, count = Counter(), Counter(), Counter()
    for _, duration, name in kernels:
        by_name[name] += duration
        by_category[category(name)] += duration
        count[name] += 1
    return {"wall_us": wall_s * 1e6, "busy_us": busy, "kernel_sum_us": sum(by_name.values()),
            "kernels": len(kernels), "by_category": dict(by_category), "by_name": dict(by_name),
            "count": dict(count), "gaps": sorted(gaps, reverse=True)}


def per_step(long: dict, short: dict, steps: int) -> dict:
    """(long - short) / steps of every figure: one decode step's share."""
    def diff(key: str) -> float:
        return (long[key] - short[key]) / steps

    def diff_map(key: str) -> dict:
        names = set(long[key]) | set(short[key])
        return {n: (long[key].get(n, 0) - short[key].get(n, 0)) / steps for n in names}

    names = diff_map("by_name")
    counts = diff_map("count")
    top = sorted(names.items(), key=lambda kv: -kv[1])[:15]
    gaps = [g for g in long["gaps"] if g[0] > GAP_US]
    return {"wall_us": diff("wall_us"), "busy_us": diff("busy_us"), "kernel_sum_us": diff("kernel_sum_us"),
            "kernels": diff("kernels"), "idle_us": diff("wall_us") - diff("busy_us"),
            "by_category": dict(sorted(diff_map("by_category").items(), key=lambda kv: -kv[1])),
            "top": [{"name": n, "us": us, "calls": counts[n], "category": category(n)} for n, us in top],
            "long_run_gaps_over_20us": {"count": len(gaps), "total_us": sum(g for g, _ in gaps),
                                        "largest": [{"us": g, "after": n[:120]} for g, n in gaps[:10]]}}


def profiled_run(backend, run, prompts: list[list[int]], new: int, device: torch.device,
                 trace: Path | None) -> dict:
    on_cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        wall = timed(device, lambda: run(backend, prompts, new))
    if trace is not None:
        raw = trace.with_suffix("")  # name.json.gz -> name.json
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        if trace.stat().st_size > TRACE_MAX_BYTES:
            print(f"  {trace.name}: {trace.stat().st_size / 2**20:.0f} MiB, too large to bring back; dropped")
            trace.unlink()
    return summarize(device_events(prof, on_cuda), wall)


def profile_shapes(backend, run, shapes: list[tuple[int, int]], steps: int, vocab: int, device: torch.device,
                   trace_dir: Path | None, label: str) -> list[dict]:
    """Per-step profile of every (batch, prompt) shape (module docstring); ``run(backend, prompts, new)`` generates.
    Traces of the long runs, gzipped, in ``trace_dir`` (None: none)."""
    rows = []
    for batch, prompt_len in shapes:
        def prompts(seed: int) -> list[list[int]]:
            return random_prompts(batch, prompt_len, vocab, seed=1000 * batch + seed)

        run(backend, prompts(0), steps + 1)  # warm-up: graphs captured, kernels compiled
        unprofiled = timed(device, lambda: run(backend, prompts(1), steps + 1))
        unprofiled -= timed(device, lambda: run(backend, prompts(2), 1))
        short = profiled_run(backend, run, prompts(3), 1, device, None)
        trace = None if trace_dir is None else trace_dir / f"trace_{label}_b{batch}_p{prompt_len}.json.gz"
        long = profiled_run(backend, run, prompts(4), steps + 1, device, trace)
        rows.append({"batch": batch, "prompt": prompt_len, "steps": steps,
                     "unprofiled_wall_us": unprofiled / steps * 1e6, **per_step(long, short, steps)})
        print(f"  {label} batch {batch} {prompt_len}+{steps + 1}: step {rows[-1]['unprofiled_wall_us'] / 1e3:.2f} ms "
              f"(profiled {rows[-1]['wall_us'] / 1e3:.2f} ms)", flush=True)
    return rows


def report(whole: list[dict], split: list[dict], ranks: int) -> None:
    """Side by side per shape: the engine alone, its shard on rank 0 of ``ranks``."""
    for w, s in zip(whole, split):
        print(f"\n### batch {w['batch']}, prompt {w['prompt']}: per decode step (us), 1 GPU vs rank 0 of {ranks}")
        print("| | 1 GPU | TP | TP / 1 GPU |\n|---|---|---|---|")
        for key in ("unprofiled_wall_us", "wall_us", "busy_us", "idle_us", "kernel_sum_us", "kernels"):
            print(_row(key, w[key], s[key]))
        for name in sorted(set(w["by_category"]) | set(s["by_category"]), key=lambda n: -s["by_category"].get(n, 0)):
            print(_row(name, w["by_category"].get(name, 0.0), s["by_category"].get(name, 0.0)))
        for label, row in (("1 GPU", w), ("TP", s)):
            gaps = row["long_run_gaps_over_20us"]
            print(f"\n{label}: top kernels per step (us, calls, category); idle gaps > {GAP_US:.0f} us in the long "
                  f"run: {gaps['count']}, {gaps['total_us']:.0f} us")
            for k in row["top"]:
                print(f"  {k['us']:8.1f} {k['calls']:6.1f}  {k['category']:16s} {k['name'][:100]}")
            for g in gaps["largest"][:5]:
                print(f"  gap {g['us']:8.0f} us after {g['after'][:90]}")


def _row(name: str, whole: float, split: float) -> str:
    ratio = f"{split / whole:.2f}" if whole > 0 else "-"
    return f"| {name} | {whole:.1f} | {split:.1f} | {ratio} |"
