"""N-gram speculative decoding on real text: a finished run's model on its own training prompts, decoded plainly and
with ``rollout.speculative.method = "ngram"`` (same prompts, seed and max_tokens), at the training temperature and
greedy. Reports the acceptance rate (the engine's per-request telemetry, as the inference-aware reward reads it),
the tokens each verify step kept, tokens/s of both and their ratio (the speed-up), the mean completion length, and,
greedy, how many prompts the two decode differently (they must not).

    python -m bench.ngram_real --run runs/qwen-coder-plain --out ngram.json
        # the run's config.toml and final checkpoint; --model start: the recipe's starting model instead
    python -m bench.ngram_real --run RUN --config examples/qwen-coder-0.5b-gsm8k.toml --set data.path=\\"...\\"

Prompts: the distinct training prompts of the run's samples.jsonl in the order it met them, topped up with the task's
first train rows, rendered as the recipe renders them (chat template, system prompt). Each setting's engine is built
by the trainer's own path (``make_backend`` on the config with the speculative section set); requests go in
batches of ``--batch`` prompts, each batch one ``generate`` call; ``--warmup`` untimed passes over all prompts come
first (they capture the CUDA graphs the timed pass meets).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from datetime import date
from pathlib import Path

import torch

from bench.engine_throughput import timed
from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.factory import make_backend
from tandemrl.config import Config, load_config, validate_config
from tandemrl.data.loading import load_data
from tandemrl.models.load import resolve_device
from tandemrl.telemetry.request_stats import request_metrics
from tandemrl.telemetry.writers import read_metrics
from tandemrl.train.eval_run import CONFIG_FILE, find_run, load_trained
from tandemrl.train.rollouts import prompt_encoder, rollout_params
from tandemrl.train.setup import model_context
from tandemrl.types import Request, Rollout, Sample, SamplingParams


def with_speculation(cfg: Config, num_tokens: int | None) -> Config:
    """``cfg`` with n-gram speculation of ``num_tokens`` proposals (None: off), validated as a user's config is."""
    raw = cfg.model_dump(exclude_none=True)
    spec = raw["rollout"]["speculative"]
    spec.pop("method", None)
    if num_tokens is not None:
        spec.update(method="ngram", num_tokens=num_tokens)
    return validate_config(raw)


def training_samples(cfg: Config, run: Path | None, count: int) -> tuple[list[Sample], int]:
    """The first ``count`` distinct samples the run trained on (samples.jsonl), then the task's first train rows;
    and how many came from the run."""
    train = load_data(cfg.data, cfg.train.seed, cfg.eval.limit).train
    by_index = {s.index: s for s in train}
    from_run: list[int] = []
    log = run / "samples.jsonl" if run is not None else None
    if log is not None and log.is_file():
        trained = dict.fromkeys(row["sample"] for row in read_metrics(log) if row.get("sample") is not None)
        from_run = list(trained)[:count]
        missing = [i for i in from_run if i not in by_index]
        if missing:
            raise ValueError(f"{log} names train sample {missing[0]}, which the config's data does not have "
                             "(another data.path or data.train_limit than the run's?)")
    chosen = set(from_run)
    rest = [s.index for s in train if s.index not in chosen][:count - len(from_run)]
    return [by_index[i] for i in from_run + rest], len(from_run)


def decode(backend: RolloutBackend, prompts: list[list[int]], params: SamplingParams, batch: int) -> list[Rollout]:
    rollouts: list[Rollout] = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        rollouts += backend.generate([Request(f"r{start + i}", p, params) for i, p in enumerate(chunk)])
    failed = [r for r in rollouts if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rollouts)} requests failed; the first: {failed[0].error}")
    return rollouts


def measure(backend: RolloutBackend, prompts: list[list[int]], params: SamplingParams, args: argparse.Namespace,
            device: torch.device) -> tuple[dict, list[list[int]]]:
    """One setting: ``--warmup`` untimed passes, then a timed one; its row and its completions' tokens."""
    for _ in range(args.warmup):
        decode(backend, prompts, params, args.batch)
    out: list[Rollout] = []
    seconds = timed(device, lambda: out.extend(decode(backend, prompts, params, args.batch)))
    tokens = sum(len(r.completion_ids) for r in out)
    stats = [r.stats for r in out]
    drafted, accepted = sum(s.drafted_tokens for s in stats), sum(s.accepted_tokens for s in stats)
    steps = sum(s.verify_steps for s in stats)
    spec = request_metrics(out)
    row = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
           "mean_completion_tokens": tokens / len(out),
           "finished_by_eos": sum(r.finish_reason == "stop" for r in out) / len(out),
           "acceptance_rate": spec.get("spec/acceptance_rate"),
           "accepted_per_verify": accepted / steps if steps else None,  # kept proposals per verify step
           "tokens_per_verify": spec.get("spec/mean_accepted_length"),  # the kept ones plus the target's own token
           "proposed_per_verify": drafted / steps if steps else None}  # < k: no match, or the sequence's end near
    return row, [r.completion_ids for r in out]


def compare(rows: list[dict], completions: dict[tuple[float, int | None], list[list[int]]]) -> None:
    """Speed-up over plain at the same temperature; greedy: how many prompts ngram decodes differently."""
    plain = {r["temperature"]: r for r in rows if r["num_tokens"] is None}
    for row in rows:
        temperature, k = row["temperature"], row["num_tokens"]
        row["speedup"] = row["tokens_per_s"] / plain[temperature]["tokens_per_s"]
        row["differing_prompts"] = None
        if temperature == 0 and k is not None:
            row["differing_prompts"] = sum(a != b for a, b in zip(completions[(temperature, k)],
                                                                  completions[(temperature, None)]))


def run_settings(cfg: Config, model, tokenizer, prompts: list[list[int]], args: argparse.Namespace,
                 device: torch.device) -> list[dict]:
    rows: list[dict] = []
    completions: dict[tuple[float, int | None], list[list[int]]] = {}
    base = rollout_params(cfg.rollout, seed=cfg.train.seed)
    for k in [None, *args.num_tokens]:  # one engine per speculation setting, both temperatures through it
        backend = make_backend(with_speculation(cfg, k), model, tokenizer, device)
        try:
            for temperature in args.temperature:
                params = dataclasses.replace(base, temperature=temperature)
                row, completions[(temperature, k)] = measure(backend, prompts, params, args, device)
                rows.append({"temperature": temperature, "method": "plain" if k is None else "ngram",
                             "num_tokens": k, **row})
                print(f"  T={temperature} {rows[-1]['method']} k={k}: {row['tokens_per_s']:.0f} tok/s", flush=True)
        finally:
            backend.close()
    compare(rows, completions)
    return rows


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(result: dict) -> None:
    print(f"\nn-gram speculation on {result['prompts']} prompts of {result['run'] or result['config']} "
          f"({result['model']} model{', ' + result['checkpoint'] if result['checkpoint'] else ''}), max_tokens "
          f"{result['max_tokens']}, batch {result['batch']}, {result['device']}\n")
    print("| T | method | k | tokens/s | speed-up | acceptance | accepted/verify | tokens/verify | proposed/verify "
          "| mean length | greedy prompts differing |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['temperature']} | {r['method']} | {_fmt(r['num_tokens'], 'd')} | {r['tokens_per_s']:.0f} | "
              f"{r['speedup']:.2f} | {_fmt(r['acceptance_rate'])} | {_fmt(r['accepted_per_verify'], '.2f')} | "
              f"{_fmt(r['tokens_per_verify'], '.2f')} | {_fmt(r['proposed_per_verify'], '.2f')} | "
              f"{r['mean_completion_tokens']:.1f} | {_fmt(r['differing_prompts'], 'd')} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="a finished run directory (its samples.jsonl and checkpoints)")
    parser.add_argument("--config", type=Path, help="the recipe TOML (default: the run's config.toml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, as `tandemrl train --set` (e.g. data.path, model.dtype)")
    parser.add_argument("--model", choices=("final", "start"), default="final",
                        help="final: the run's latest checkpoint; start: the config's starting model")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0, 0.0])
    parser.add_argument("--num-tokens", type=int, nargs="+", default=[2, 4], help="n-gram proposals per step (k)")
    parser.add_argument("--batch", type=int, default=64, help="prompts per generate call")
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes over all prompts before each timing")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    args = parser.parse_args(argv)
    if args.run is None and (args.config is None or args.model == "final"):
        parser.error("--run is needed (the final checkpoint); without one give --config and --model start")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cfg = load_config(args.config or args.run / CONFIG_FILE, args.overrides)
    checkpoint = None
    if args.model == "final":
        found = find_run(args.run)
        checkpoint = found[1] if found is not None else None
        if checkpoint is None:
            raise FileNotFoundError(f"{args.run} has no complete checkpoint under {args.run / 'checkpoints'} "
                                    "(or no config.toml); --model start uses the starting model")
    device = resolve_device(cfg.model.device)
    model, tokenizer = load_trained(cfg, checkpoint, device)
    model.eval()
    samples, from_run = training_samples(cfg, args.run, args.prompts)
    encoder = prompt_encoder(cfg, tokenizer, None, context=model_context(model))
    prompts = [encoder.encode(s)[1] for s in samples]
    rows = run_settings(cfg, model, tokenizer, prompts, args, device)
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "run": str(args.run) if args.run else None,
        "config": str(args.config or args.run / CONFIG_FILE), "model": args.model,
        "checkpoint": str(checkpoint) if checkpoint else None, "prompts": len(prompts), "prompts_from_run": from_run,
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "max_tokens": cfg.rollout.max_tokens,
        "seed": cfg.train.seed, "batch": args.batch, "ngram_min": cfg.rollout.speculative.ngram_min,
        "ngram_max": cfg.rollout.speculative.ngram_max, "rows": rows,
    }
    print_table(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
