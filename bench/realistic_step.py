"""A GRPO step at realistic lengths: completions of drawn lengths (lognormal, median 600, cap 4096), 32 prompts x 8.

Each row stops at its drawn length (EOS ignored, per-request max_tokens), so the long tail of real RL rollouts is
there while the weights stay random (speed does not depend on their values). Reports rollout, its tail (time after
half the rows finished), the packed update, the step, peak memory and the update's MFU (6 x params x tokens trained /
update time / the device's dense bf16 peak), and the tokens a padded update would compute on beside the packed ones.

GPU: python -m bench.realistic_step --model qwen2.5-0.5b [--padded-too]; CPU smoke: python -m bench.realistic_step --tiny
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch

from bench.grpo_step import ARCHITECTURES, build_model, make_backend
from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.config import TrainConfig
from tandemrl.models.compile import compile_decoder_layers
from tandemrl.train.batch import build_batch
from tandemrl.train.micro_batches import micro_batch_limits, plan_micro_batches
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.packed_support import _VERDICT
from tandemrl.train.packing import padded_tokens
from tandemrl.train.update import policy_update
from tandemrl.types import Request, SamplingParams

# Dense bf16 tensor-core peaks from the vendors' spec sheets (SXM parts), TFLOP/s; MFU is against these.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


@dataclass
class StepResult:
    rollout_s: float
    rollout_tail_s: float  # from the moment half the rows had finished to the last row's end
    update_s: float  # the packed policy update (log-probs, loss, backward, optimizer step)
    step_s: float
    peak_gib: float
    completion_tokens: int
    drawn_tokens: int  # the sum of the drawn lengths: each row stops at its own
    trained_tokens: int  # prompt + completion tokens the packed update computes on
    padded_tokens: int  # what the padded update (rows padded to the batch's widest) computed on
    micro_batches: int
    update_mfu: float
    padded_update_s: float | None = None  # the same update on padded rows (--padded-too)


def draw_lengths(count: int, args: argparse.Namespace, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    draws = torch.empty(count).log_normal_(math.log(args.median), args.sigma, generator=gen)
    return draws.round().clamp(1, args.cap).long().tolist()


def one_step(model, backend, optimizer, scheduler, cfg: TrainConfig, args, device, seed: int) -> StepResult:
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (args.prompts, args.prompt_len), generator=gen).tolist()
    lengths = draw_lengths(args.prompts * args.group, args, seed)
    requests = [Request(f"{i}-{j}", p, SamplingParams(max_tokens=lengths[i * args.group + j], temperature=1.0,
                                                      ignore_eos=True, seed=seed))
                for i, p in enumerate(prompts) for j in range(args.group)]
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    rollouts = backend.generate(requests)
    _sync(device)
    rollout_s = time.perf_counter() - start
    tail_s = _tail(rollouts)
    rewards = torch.rand(len(rollouts), generator=gen)
    advantages = ADVANTAGES.get("grpo")(rewards, torch.ones_like(rewards, dtype=torch.bool), args.group)
    backend.sleep()
    batch = build_batch(rollouts, advantages, pad_id=0, device=device)
    update_s = _timed_update(model, batch, optimizer, scheduler, cfg, args, device)
    padded_s = None
    if args.padded_too:
        setattr(model, _VERDICT, False)  # the fallback path: padded rows, args.padded_micro_batch per forward
        rows_cfg = cfg.model_copy(update={"micro_batch_size": args.padded_micro_batch})
        padded_s = _timed_update(model, batch, optimizer, scheduler, rows_cfg, args, device)
        delattr(model, _VERDICT)
    backend.wake()
    seq_lengths = batch.sequence_lengths().tolist()
    plan = plan_micro_batches(seq_lengths, micro_batch_limits(cfg, model), batch.prompt_lengths().tolist())
    trained = sum(seq_lengths)
    params = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return StepResult(
        rollout_s=rollout_s, rollout_tail_s=tail_s, update_s=update_s, step_s=rollout_s + update_s, peak_gib=peak,
        completion_tokens=sum(len(r.completion_ids) for r in rollouts), drawn_tokens=sum(lengths),
        trained_tokens=trained,
        padded_tokens=batch.input_ids.numel(), micro_batches=len(plan),
        update_mfu=6 * params * trained / update_s / (args.peak_tflops * 1e12), padded_update_s=padded_s,
    )


def _timed_update(model, batch, optimizer, scheduler, cfg, args, device) -> float:
    _sync(device)
    start = time.perf_counter()
    policy_update(model, batch, optimizer, scheduler, cfg, temperature=1.0, max_completion_length=args.cap)
    _sync(device)
    return time.perf_counter() - start


def _tail(rollouts) -> float:
    finished = sorted(r.stats.finished_time for r in rollouts if r.stats.finished_time is not None)
    if len(finished) < 2:
        return float("nan")  # a backend that does not time requests
    return finished[-1] - finished[(len(finished) - 1) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, given: float | None) -> float:
    if given is not None:
        return given
    if device.type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), float("nan"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: the tiny architecture, small shapes")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--median", type=float, default=600.0, help="median completion length")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the completion lengths")
    parser.add_argument("--cap", type=int, default=4096, help="longest completion (rollout.max_tokens)")
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    parser.add_argument("--attn", default=None, help="attn_implementation (sdpa, flex_attention, varlen, ...); "
                        "default flex_attention on CUDA, sdpa else")
    parser.add_argument("--padded-too", action="store_true", help="also time the padded update on the same batch")
    parser.add_argument("--padded-micro-batch", type=int, default=4, help="rows per forward of --padded-too")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true", help="model.compile: the decoder layers compiled for the "
                        "update (the warm-up step pays the compile: cold_update_s)")
    parser.add_argument("--kv-gib", type=float, default=16.0, help="engine KV cache size")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: by GPU)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.backend = "engine"
    if args.tiny:
        args.model, args.prompts, args.group, args.prompt_len = "tiny", 2, 4, 8
        args.median, args.cap, args.max_tokens_per_micro_batch, args.kv_gib, args.repeats = 12.0, 48, 64, 0.01, 1
    args.out = args.out or Path(f"bench/out/realistic_step_{args.model}.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    args.attn = args.attn or ("flex_attention" if device.type == "cuda" else "sdpa")
    args.peak_tflops = peak_tflops(device, args.peak_tflops)
    model = build_model(args.model, device, dtype, args.gradient_checkpointing, args.attn)
    if args.compile:
        compile_decoder_layers(model)
    backend = make_backend(args, model, device)
    cfg = TrainConfig(lr=1e-6, max_steps=args.repeats + 2, max_tokens_per_micro_batch=args.max_tokens_per_micro_batch)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    # Warm-up at full shape: kernels (flex_attention compiles), allocator pools and optimizer state in place.
    warm_up = one_step(model, backend, optimizer, scheduler, cfg, args, device, seed=1000)
    runs = [one_step(model, backend, optimizer, scheduler, cfg, args, device, seed=s) for s in range(args.repeats)]
    median = sorted(runs, key=lambda r: r.step_s)[len(runs) // 2]
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "model": args.model, "attn_implementation": args.attn,
        "compile": args.compile, "cold_update_s": warm_up.update_s,  # with --compile: the cold compile's time too
        "shape": {"prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len, "median": args.median,
                  "sigma": args.sigma, "cap": args.cap},
        "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch, "peak_bf16_tflops": args.peak_tflops,
        "params": sum(p.numel() for p in model.parameters()),
        "runs": [asdict(r) for r in runs], "median": asdict(median),
        "padding_waste": 1 - median.trained_tokens / median.padded_tokens,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print_table(result, median, args)


def _print_table(result: dict, m: StepResult, args: argparse.Namespace) -> None:
    padded = f"{m.padded_update_s:.2f}" if m.padded_update_s is not None else "-"
    print(f"MFU against a dense bf16 peak of {args.peak_tflops} TFLOP/s; attention: {args.attn}; compiled layers: "
          f"{args.compile} (warm-up update {result['cold_update_s']:.1f} s)")
    print("| device | model | shape | rollout s | tail s | update s | step s | peak GiB | update MFU | "
          "tokens trained | padded tokens (waste) | padded update s |")
    print(f"| {result['device']} | {args.model} | {args.prompts}x{args.group}, median {args.median:.0f}, cap "
          f"{args.cap} | {m.rollout_s:.2f} | {m.rollout_tail_s:.2f} | {m.update_s:.2f} | {m.step_s:.2f} | "
          f"{m.peak_gib:.1f} | {m.update_mfu:.1%} | {m.trained_tokens} | {m.padded_tokens} "
          f"({result['padding_waste']:.0%}) | {padded} |")


if __name__ == "__main__":
    main()
