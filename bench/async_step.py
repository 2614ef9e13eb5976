"""Samples/s of rollout.mode = "async" against "sync" on the same model, batch and GPU(s) (issue 40).

Builds a random-weight model of a published architecture (default Qwen2.5-0.5B, bf16) with the project's character
tokenizer, then trains it for --steps steps on the offline addition task twice with the same config: once
synchronously, once asynchronously (rollout.max_staleness = --staleness; on two GPUs the worker's copy on cuda:1).
Completions run --new-tokens tokens (ignore_eos: random weights never say EOS). Each run's steady-state step time
(the steps after --warmup) gives samples/s; the async run also reports how long the trainer waited for rollouts
(rollout_share: in sync the share of a step spent sampling, in async the share the trainer waited: its idle
share) and the worker's busy share.

GPU:  python -m bench.async_step --out $OUT/async_step.json
CPU:  python -m bench.async_step --arch tiny --steps 4 --warmup 1 --new-tokens 8 --prompts 4 --group 4 (script check)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from bench.grpo_step import build_model
from bench.serve_process import save_model_dir
from tandemrl.config import load_config
from tandemrl.train.loop import train


def run_config(args: argparse.Namespace, model_dir: Path, mode: str):
    sets = [f'model.name_or_path="{model_dir}"', f'model.device="{args.device}"', f'model.dtype="{args.dtype}"',
            f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            f"rollout.max_tokens={args.new_tokens}", "rollout.ignore_eos=true", f"train.max_steps={args.steps}",
            "train.lr=1e-6", "eval.limit=4", "eval.pass_k=0", "checkpoint.every_steps=0", "log.samples=false",
            "log.tensorboard=false", "log.print_completions_every=0", f"engine.gpu_memory_utilization={args.kv_share}",
            f"rollout.mode={mode}"]
    if mode == "async":
        sets.append(f"rollout.max_staleness={args.staleness}")
        if args.device == "cuda" and torch.cuda.device_count() > 1:
            sets.append('rollout.async_device="cuda:1"')
    return load_config(None, sets)


def steady(rows: list[dict], warmup: int, key: str) -> float | None:
    values = [r[key] for r in rows[warmup:] if key in r]
    return statistics.mean(values) if values else None


def measure(args: argparse.Namespace, model_dir: Path, mode: str, workdir: Path) -> dict:
    out = workdir / mode
    summary = train(run_config(args, model_dir, mode), out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    # a step's whole wall time: what it costs when rollouts and updates overlap
    step_s = steady(rows, args.warmup, "time/step_wall")
    samples = args.prompts * args.group
    result = {"steps": summary["steps"], "step_s": step_s, "samples_per_s": samples / step_s if step_s else None,
              "rollout_wait_s": steady(rows, args.warmup, "time/rollout"),
              "train_s": steady(rows, args.warmup, "time/train")}
    if mode == "async":
        result.update(worker_busy=steady(rows, args.warmup, "async/worker_busy"),
                      version_lag_mean=steady(rows, args.warmup, "async/version_lag_mean"),
                      dropped_groups=sum(r.get("async/dropped_groups", 0) for r in rows),
                      push_s=steady(rows, args.warmup, "async/push_s"),
                      worker_pause_s=steady(rows, args.warmup, "async/worker_pause_s"))
    if result["rollout_wait_s"] is not None and step_s:
        result["rollout_share"] = result["rollout_wait_s"] / step_s  # sync: sampling; async: the trainer waiting
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-0.5b")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the means (graphs, caches)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--kv-share", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=Path("bench/out/async_step.json"))
    args = parser.parse_args(argv)
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict = {"arch": args.arch, "gpus": torch.cuda.device_count(), "device": torch.cuda.get_device_name(0)
                    if args.device == "cuda" else "cpu", "samples_per_step": args.prompts * args.group,
                    "new_tokens": args.new_tokens, "staleness": args.staleness}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = build_model(args.arch, torch.device("cpu"), getattr(torch, args.dtype), False)
        model_dir = save_model_dir(model, workdir / "model")
        del model
        for mode in ("sync", "async"):
            result[mode] = measure(args, model_dir, mode, workdir)
            args.out.write_text(json.dumps(result, indent=2))
    sync_rate, async_rate = result["sync"]["samples_per_s"], result["async"]["samples_per_s"]
    if sync_rate and async_rate:
        result["async_over_sync"] = async_rate / sync_rate
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
