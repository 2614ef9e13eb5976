"""Plain GRPO (alpha = beta = 0) against the inference-aware reward's latency and length penalties, at equal steps,
on the CPU default (the tiny offline model, synthetic single-digit addition). With ``rollout.max_tokens`` well above
the one-digit answer and EOS honoured, the response length is free to vary: the accuracy reward reads the last
number, so trailing characters cost nothing but tokens and time.

Both runs start from one warm start (``--warm-start-steps`` of plain GRPO at the default ``rollout.max_tokens = 3``,
where the tiny model learns the task): from the random model, whose accuracy is 0, every group's accuracy is equal,
GRPO's group-std normalisation turns the tiny penalties into the whole advantage and the penalised model learns to
stop at once (see bench/RESULTS.md). ``--warm-start-steps 0`` runs that case.

    python -m bench.inference_reward_cpu                  # warm start, two runs of --steps steps, a table and JSON
    python -m bench.inference_reward_cpu --warm-start-steps 0 --steps 20       # a quick check of the script
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from rich.console import Console

from tandemrl.config import load_config
from tandemrl.telemetry.writers import read_metrics
from tandemrl.train.loop import train


def run_one(out_dir: Path, args: argparse.Namespace, latency: float, tokens: float, model: str = "tiny",
            steps: int | None = None, max_tokens: int | None = None, advantage: str = "grpo") -> dict:
    cfg = load_config(None, [
        f'model.name_or_path="{model}"', "model.device=cpu", f'model.tiny_dir="{args.tiny_dir}"',
        f"train.max_steps={steps or args.steps}", f"train.seed={args.seed}",
        f"rollout.max_tokens={max_tokens or args.max_tokens}", "rollout.ignore_eos=false",
        f"eval.limit={args.eval_limit}", "eval.pass_k=0", "checkpoint.every_steps=0", "log.tensorboard=false",
        "log.samples=false", f"reward.inference.latency={latency}", f"reward.inference.tokens={tokens}",
        f'train.advantage="{advantage}"',
    ])
    started = time.perf_counter()
    summary = train(cfg, out_dir, console=Console(quiet=True))
    rows = [r for r in read_metrics(out_dir / "metrics.jsonl") if "response_length/mean" in r]
    tail = rows[-args.window:]
    return {
        "advantage": advantage, "latency_weight": latency, "tokens_weight": tokens, "steps": summary["steps"],
        "eval_accuracy_initial": summary["initial"]["accuracy"], "eval_accuracy": summary["final"]["accuracy"],
        "eval_response_length_initial": summary["initial"]["response_length"],
        "eval_response_length": summary["final"]["response_length"],
        "train_response_length_first": statistics.fmean(r["response_length/mean"] for r in rows[:args.window]),
        "train_response_length_last": statistics.fmean(r["response_length/mean"] for r in tail),
        "train_accuracy_last": statistics.fmean(r["accuracy"] for r in tail),
        "latency_ms_last": 1000 * statistics.fmean(r["requests/latency_s/mean"] for r in tail),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--latency", type=float, default=0.001, help="alpha, per ms (the seed's default)")
    parser.add_argument("--tokens", type=float, default=0.001, help="beta, per generated token (the seed's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--advantage", nargs="+", default=["grpo"],
                        help="train.advantage: a plain and a penalised run for each (grpo, dr_grpo, step_norm)")
    parser.add_argument("--eval-limit", type=int, default=200)
    parser.add_argument("--warm-start-steps", type=int, default=300,
                        help="first train plain GRPO this many steps; both runs start from its checkpoint")
    parser.add_argument("--warm-start-max-tokens", type=int, default=3,
                        help="rollout.max_tokens of the warm start (3: the CPU default, where the tiny model learns)")
    parser.add_argument("--window", type=int, default=20, help="steps averaged for the train-side numbers")
    parser.add_argument("--tiny-dir", default="runs/tiny-model")
    parser.add_argument("--out", type=Path, default=Path("bench/out/inference_reward_cpu.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start, warm = "tiny", None
        if args.warm_start_steps:  # both runs continue from one plain-GRPO checkpoint that already answers
            warm = run_one(Path(tmp) / "warm", args, 0.0, 0.0, steps=args.warm_start_steps,
                           max_tokens=args.warm_start_max_tokens)
            start = str(Path(tmp) / "warm" / "checkpoints" / f"step-{args.warm_start_steps:08d}")
        runs = []
        for advantage in args.advantage:
            runs.append(("plain", run_one(Path(tmp) / f"plain-{advantage}", args, 0.0, 0.0, start,
                                               advantage=advantage)))
            runs.append(("penalised", run_one(Path(tmp) / f"penalised-{advantage}", args, args.latency, args.tokens,
                                              start, advantage=advantage)))
    result = {"date": date.today().isoformat(), "cpu": platform.processor() or platform.machine(),
              "args": {k: str(v) for k, v in vars(args).items()}, "warm_start": warm,
              "runs": [{"name": name, **r} for name, r in runs]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if warm is not None:
        print(f"warm start: {warm['steps']} plain GRPO steps at rollout.max_tokens={args.warm_start_max_tokens}: "
              f"eval accuracy {warm['eval_accuracy_initial']:.3f} -> {warm['eval_accuracy']:.3f}")
    print(f"| run | advantage | alpha | beta | steps | eval acc (initial -> final) | eval len (initial -> final) | "
          f"train len (first {args.window} -> last {args.window} steps) | train acc (last) | latency ms (last) | s |")
    for name, r in runs:
        print(f"| {name} | {r['advantage']} | {r['latency_weight']} | {r['tokens_weight']} | {r['steps']} | "
              f"{r['eval_accuracy_initial']:.3f} -> {r['eval_accuracy']:.3f} | "
              f"{r['eval_response_length_initial']:.2f} -> {r['eval_response_length']:.2f} | "
              f"{r['train_response_length_first']:.2f} -> {r['train_response_length_last']:.2f} | "
              f"{r['train_accuracy_last']:.3f} | {r['latency_ms_last']:.1f} | {r['seconds']} |")


if __name__ == "__main__":
    main()
