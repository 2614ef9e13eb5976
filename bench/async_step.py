"""Samples/s of rollout.mode = "async" against "sync" on the same model and batch, and against synchronous data
parallelism on the same two GPUs (issue 40).

Builds a random-weight model of a published architecture (default Qwen2.5-0.5B, bf16) with the project's character
tokenizer, then trains it for --steps steps on the offline addition task with the same config in each --modes entry:
  sync     the synchronous loop, one process (one GPU)
  sync-dp  the synchronous loop under torchrun on 2 ranks (replicated: each rank samples and trains half of the same
           global batch; gloo on the CPU)
  async    rollout.max_staleness = --staleness, the worker's copy on cuda:1 when there are two GPUs
Completion lengths: --mean-tokens M > 0 names round(vocab / M) ids as EOS in the model's generation_config (a random
model's near-flat logits then stop a completion with probability ~1/M a token: geometric lengths, cut at
--new-tokens; bench/long_tail.py), so a synchronous step waits for its longest completion; each mode reports the
measured lengths (mean, p50, p99, max, from samples.jsonl). --mean-tokens 0: every completion runs --new-tokens
tokens (EOS ignored). Each run's steady-state step time (the steps after --warmup) gives samples/s; rollout_share is,
in sync, the share of a step spent sampling, in async the share the trainer waited for rollouts (its idle share);
the async run also reports the worker's busy share. other_s is the rest of a step (neither the wait for rollouts nor
the update), with its host-side parts: prepare_s (the batch assembled), sync_s (the weight push), weight_gather_s and
record_s (samples.jsonl and the metrics).

GPU (2):  python -m bench.async_step --out $OUT/async_step.json        (all three modes)
CPU:      python -m bench.async_step --arch tiny --steps 3 --warmup 1 --new-tokens 16 --mean-tokens 4 --prompts 2 \
              --group 4 --modes sync sync-dp async                     (script check)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.grpo_step import build_model
from bench.long_tail import length_stats, stop_ids
from bench.serve_process import child_env, save_model_dir
from tandemrl.config import load_config
from tandemrl.train.loop import train

PHASES = ("prepare", "sync", "weight_gather", "record")  # time/<phase>: what a step spends outside rollout and train
MODES = ("sync-dp", "sync", "async")  # the order they run in: sync-dp's ranks start with both GPUs free
DP_RANKS = 2


def config_sets(args: argparse.Namespace, model_dir: Path, mode: str) -> list[str]:
    sets = [f'model.name_or_path="{model_dir}"', f'model.device="{args.device}"', f'model.dtype="{args.dtype}"',
            f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            f"rollout.max_tokens={args.new_tokens}", f"rollout.ignore_eos={str(args.mean_tokens == 0).lower()}",
            f"train.max_steps={args.steps}", "train.lr=1e-6", "eval.limit=4", "eval.pass_k=0",
            "checkpoint.every_steps=0", "log.samples=true", "log.sample_text_per_step=0", "log.tensorboard=false",
            "log.print_completions_every=0", f"engine.gpu_memory_utilization={args.kv_share}",
            f"rollout.mode={'async' if mode == 'async' else 'sync'}"]
    if mode == "async":
        sets.append(f"rollout.max_staleness={args.staleness}")
        if args.device == "cuda" and torch.cuda.device_count() > 1:
            sets.append('rollout.async_device="cuda:1"')
    return sets


def train_data_parallel(sets: list[str], out: Path, log: Path, timeout_s: float) -> None:
    """`tandemrl train` under torchrun on DP_RANKS ranks (the strategy chosen by the trainer: replicate here);
    rollout.prompts_per_step stays the global batch, split over the ranks. Its output goes to ``log``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={DP_RANKS}",
               "-m", "tandemrl", "train", "--out", str(out)] + [a for s in sets for a in ("--set", s)]
    with open(log, "w") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=child_env(), timeout=timeout_s)
    if done.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("error:") or "Error: " in line][-6:]  # above the report
        report = "\n".join(errors + lines[-20:])
        raise RuntimeError(f"sync-dp: torchrun exited {done.returncode}; from {log}:\n{report}")


def steady(rows: list[dict], warmup: int, key: str) -> float | None:
    values = [r[key] for r in rows[warmup:] if key in r]
    return statistics.mean(values) if values else None


def measure(args: argparse.Namespace, model_dir: Path, mode: str, workdir: Path) -> dict:
    out = workdir / mode
    sets = config_sets(args, model_dir, mode)
    if mode == "sync-dp":
        train_data_parallel(sets, out, args.out.with_name(f"{args.out.stem}_sync_dp.log"), args.launch_timeout)
    else:
        train(load_config(None, sets), out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    # a step's whole wall time: what it costs when rollouts and updates overlap (torchrun: the mean over ranks)
    step_s = steady(rows, args.warmup, "time/step_wall")
    samples = args.prompts * args.group
    result = {"steps": json.loads((out / "summary.json").read_text())["steps"], "step_s": step_s,
              "samples_per_s": samples / step_s if step_s else None,
              "rollout_wait_s": steady(rows, args.warmup, "time/rollout"),
              "train_s": steady(rows, args.warmup, "time/train"),
              # the rest of a step, host side: the batch assembled, the push (async) or weight gather, the records
              **{f"{phase}_s": steady(rows, args.warmup, f"time/{phase}") for phase in PHASES},
              # torchrun: rank 0 writes its own half of each step's rollouts
              "lengths": length_stats(out / "samples.jsonl", args.warmup)}
    if mode == "async":
        result.update(worker_busy=steady(rows, args.warmup, "async/worker_busy"),
                      version_lag_mean=steady(rows, args.warmup, "async/version_lag_mean"),
                      dropped_groups=sum(r.get("async/dropped_groups", 0) for r in rows),
                      push_s=steady(rows, args.warmup, "async/push_s"),
                      worker_pause_s=steady(rows, args.warmup, "async/worker_pause_s"))
    if result["rollout_wait_s"] is not None and step_s:
        result["rollout_share"] = result["rollout_wait_s"] / step_s  # sync: sampling; async: the trainer waiting
        result["other_s"] = step_s - result["rollout_wait_s"] - (result["train_s"] or 0.0)  # outside both
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the means (graphs, caches)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts a step, the global batch in every mode")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=1024, help="the completion length cap")
    parser.add_argument("--mean-tokens", type=int, default=128,
                        help="the completions' mean length (geometric); 0: every one --new-tokens long")
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--kv-share", type=float, default=0.25)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=None,
                        help="default: all three with two GPUs, else sync and async")
    parser.add_argument("--launch-timeout", type=float, default=600.0, help="seconds for the sync-dp launch")
    parser.add_argument("--out", type=Path, default=Path("bench/out/async_step.json"))
    args = parser.parse_args(argv)
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.modes is None:
        args.modes = list(MODES) if torch.cuda.device_count() >= DP_RANKS else ["sync", "async"]
    if "sync-dp" in args.modes and args.device == "cuda" and torch.cuda.device_count() < DP_RANKS:
        parser.error(f"--modes sync-dp needs {DP_RANKS} GPUs; this machine has {torch.cuda.device_count()}")
    if "sync-dp" in args.modes and args.prompts % DP_RANKS:
        parser.error(f"--modes sync-dp splits --prompts over {DP_RANKS} ranks: {args.prompts} is not a multiple")
    if args.mean_tokens < 0:
        parser.error("--mean-tokens must be >= 0")
    return args


def ratios(result: dict) -> dict[str, float]:
    rate = {mode: result[mode].get("samples_per_s") for mode in MODES if mode in result}
    pairs = {"async_over_sync": ("async", "sync"), "async_over_sync_dp": ("async", "sync-dp"),
             "sync_dp_over_sync": ("sync-dp", "sync")}
    return {name: rate[a] / rate[b] for name, (a, b) in pairs.items() if rate.get(a) and rate.get(b)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict = {"arch": args.arch, "gpus": torch.cuda.device_count(), "device": torch.cuda.get_device_name(0)
                    if args.device == "cuda" else "cpu", "samples_per_step": args.prompts * args.group,
                    "new_tokens": args.new_tokens, "mean_tokens": args.mean_tokens, "staleness": args.staleness}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = build_model(args.arch, torch.device("cpu"), getattr(torch, args.dtype), False)
        if args.mean_tokens:
            model.generation_config.eos_token_id = stop_ids(model.config.vocab_size, args.mean_tokens)
            result["stop_ids"] = len(model.generation_config.eos_token_id)
        model_dir = save_model_dir(model, workdir / "model")
        del model
        for mode in (m for m in MODES if m in args.modes):
            try:
                result[mode] = measure(args, model_dir, mode, workdir)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # sync-dp's launch: the other modes still run
                if mode != "sync-dp":
                    raise
                result[mode] = {"error": str(exc)}
            args.out.write_text(json.dumps(result, indent=2))
    result.update(ratios(result))
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 1 if any("error" in result[m] for m in args.modes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
