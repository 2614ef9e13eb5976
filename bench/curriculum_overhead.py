"""What the inference-aware reward and the adaptive curriculum add to training, against the work they ride on.

- per-request terms: ``add_inference_terms`` (the terms from every rollout's RequestStats at the seed's weights; no draft
  model here, so acceptance is off: its term reads two counters like the others) plus
  writing the step's rows to samples.jsonl, against the rollout's time (target: <= 2 %);
- curriculum: ``record`` after every step plus ``end_epoch`` (EMA, KDE buckets, allocation, the JSON report) over a
  train set of ``--dataset-size`` samples (GSM8K's train split: 7,473), against the time of an epoch, taken as
  steps per epoch x the median measured GRPO step (rollout + update) (target: <= 1 %).

A random-weight model of a real architecture and fixed output lengths (EOS ignored), as bench.grpo_step.
GPU: python -m bench.curriculum_overhead            CPU check of the script: python -m bench.curriculum_overhead --cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

from bench.grpo_step import add_step_shape_args, build_model, make_backend
from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.config import CurriculumConfig, TrainConfig
from tandemrl.curriculum import Curriculum
from tandemrl.curriculum.report import write_report
from tandemrl.rewards.composite import CompositeReward
from tandemrl.rewards.inference import InferenceWeights, add_inference_terms
from tandemrl.train.batch import build_batch
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.train.sample_log import SampleLog
from tandemrl.train.update import policy_update
from tandemrl.types import Request, Sample, SamplingParams

SEED_WEIGHTS = InferenceWeights(latency=0.001, tokens=0.001, kv_mb=0.01, accept=0.0, cache_reuse=0.5)


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def one_step(model, backend, optimizer, scheduler, cfg, args, device, seed, curriculum, log) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.config.vocab_size, (args.prompts, args.prompt_len), generator=gen).tolist()
    ids = torch.randint(0, args.dataset_size, (args.prompts,), generator=gen).tolist()
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=seed)
    requests = [Request(f"{i}-{j}", p, params) for i, p in enumerate(prompts) for j in range(args.group)]
    _sync(device)
    rollouts, rollout_s = timed(backend.generate, requests)
    _sync(device)
    n = len(rollouts)
    task = CompositeReward({"accuracy": (lambda prompts, completions, **k: torch.rand(len(completions), generator=gen).tolist(), 1.0)})
    result = task([""] * n, [""] * n)
    result, terms_s = timed(add_inference_terms, result, rollouts, SEED_WEIGHTS)
    group_ids = [i for i in range(args.prompts) for _ in range(args.group)]
    scored = ScoredRollouts([Sample("", "", index=ids[g]) for g in group_ids], [""] * n, rollouts, result,
                            [False] * n, group_ids)
    _, log_s = timed(log.write, seed + 1, scored)
    _, record_s = timed(curriculum.record, [s.index for s in scored.samples], result.total)
    rewards = torch.tensor(result.total, dtype=torch.float32)
    advantages = ADVANTAGES.get("grpo")(rewards, torch.ones(n, dtype=torch.bool), group_ids=torch.tensor(group_ids))
    start = time.perf_counter()
    backend.sleep()
    batch = build_batch(rollouts, advantages, pad_id=0, device=device)
    policy_update(model, batch, optimizer, scheduler, cfg, temperature=1.0, max_completion_length=args.new_tokens)
    backend.wake()
    _sync(device)
    return {"rollout_s": rollout_s, "train_s": time.perf_counter() - start, "terms_s": terms_s, "samples_log_s": log_s,
            "record_s": record_s}


def epoch_end_seconds(curriculum: Curriculum, args, out_dir: Path) -> float:
    """end_epoch over the whole train set (EMAs from a bimodal reward mix, as after real epochs) plus its report."""
    rng = np.random.default_rng(0)
    hard = rng.random(args.dataset_size) < 0.3
    rewards = np.where(hard, rng.normal(0.15, 0.1, args.dataset_size), rng.normal(0.8, 0.1, args.dataset_size))
    curriculum.record(list(range(args.dataset_size)), rewards.tolist())
    start = time.perf_counter()
    report = curriculum.end_epoch(1)
    write_report(out_dir, report)
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_shape_args(parser, repeats=5)
    parser.add_argument("--dataset-size", type=int, default=7473, help="train samples in an epoch (GSM8K: 7,473)")
    parser.add_argument("--kv-gib", type=float, default=4.0)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes, to check the script on a CPU")
    parser.add_argument("--out", type=Path, default=Path("bench/out/curriculum_overhead.json"))
    args = parser.parse_args(argv)
    args.backend = "engine"
    if args.cpu_smoke:
        args.arch, args.prompts, args.group, args.prompt_len, args.new_tokens = "tiny", 2, 2, 8, 8
        args.repeats, args.dataset_size, args.kv_gib = 1, 200, 0.01
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # a tiny model's operators are too small to split (see model.cpu_threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False)
    backend = make_backend(args, model, device)
    cfg = TrainConfig(lr=1e-6, micro_batch_size=args.micro_batch, max_steps=args.repeats + 1)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    curriculum = Curriculum(CurriculumConfig(enabled=True), list(range(args.dataset_size)), args.group)
    with tempfile.TemporaryDirectory() as tmp:
        log = SampleLog(Path(tmp))
        one_step(model, backend, optimizer, scheduler, cfg, args, device, 1000, curriculum, log)  # warm-up
        steps = [one_step(model, backend, optimizer, scheduler, cfg, args, device, s, curriculum, log)
                 for s in range(args.repeats)]
        end_s = epoch_end_seconds(curriculum, args, Path(tmp))
        log.close()
    median = {k: float(np.median([s[k] for s in steps])) for k in steps[0]}
    step_s = median["rollout_s"] + median["train_s"]
    steps_per_epoch = args.dataset_size // args.prompts
    curriculum_s = steps_per_epoch * median["record_s"] + end_s
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "arch": args.arch, "shape": f"{args.prompts}x{args.group}x{args.new_tokens}",
        "dataset_size": args.dataset_size, "steps": steps, "median": median, "end_epoch_s": end_s,
        "terms_pct_of_rollout": 100 * median["terms_s"] / median["rollout_s"],
        "terms_and_log_pct_of_rollout": 100 * (median["terms_s"] + median["samples_log_s"]) / median["rollout_s"],
        "epoch_s_estimate": steps_per_epoch * step_s, "curriculum_s_per_epoch": curriculum_s,
        "curriculum_pct_of_epoch": 100 * curriculum_s / (steps_per_epoch * step_s),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| device | arch | shape | rollout s | terms ms | terms+samples.jsonl ms | % of rollout (target <= 2) |")
    print(f"| {result['device']} | {args.arch} | {result['shape']} | {median['rollout_s']:.3f} | "
          f"{1e3 * median['terms_s']:.2f} | {1e3 * (median['terms_s'] + median['samples_log_s']):.2f} | "
          f"{result['terms_pct_of_rollout']:.3f} / {result['terms_and_log_pct_of_rollout']:.3f} |")
    print("| dataset | steps/epoch | step s | epoch s (est.) | record ms/step | end_epoch+report ms | "
          "% of epoch (target <= 1) |")
    print(f"| {args.dataset_size} | {steps_per_epoch} | {step_s:.3f} | {result['epoch_s_estimate']:.1f} | "
          f"{1e3 * median['record_s']:.3f} | {1e3 * end_s:.1f} | {result['curriculum_pct_of_epoch']:.4f} |")


if __name__ == "__main__":
    main()
