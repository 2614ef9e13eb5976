"""Speculative decoding against the standard model of its speed-up, in one run.

Random weights make acceptance meaningless, so the acceptance rate ``a`` is FIXED here by a benchmark-only acceptance
rule (``FixedAcceptance``, defined and registered in this file, named by the runner the benchmark builds: the trainer
never names it) that keeps each proposal with probability ``a`` until the first miss. Everything else is the engine's
real path: the draft's proposals, the target's verify forwards (``--rounds`` per launch), the postprocessing. ``c`` is
measured: the draft's decode step over the target's, from plain engine runs at the same batch. Every time (plain, draft,
speculative) is the fastest of the same 3 runs (``TIMED_SEEDS``' prompts). The model predicts a speed-up of
``(1 - a^(k+1)) / ((1 - a)(k c + 1))`` over plain decoding; achieved = plain time / speculative time. Each row also
says which acceptance rate its draws realized (the fastest run may be the luckiest of the three).
Telemetry overhead: the host time of the per-request bookkeeping a verify launch adds (first-token time, drafted and
accepted counts and the histogram for each of its up to ``--rounds`` rounds, KV blocks held: the same calls, timed
alone over the batch's rows) over the launch's time.

GPU:  python -m bench.speculative                      (Qwen2.5-1.5B target, Qwen2.5-0.5B draft)
CPU:  python -m bench.speculative --target tiny --draft tiny-draft --batches 2 --ks 2 --rates 0.8 --new-tokens 16
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from bench.collections_watch import FullCollections, release_garbage
from bench.engine_throughput import random_prompts, timed
from bench.grpo_step import ARCHITECTURES, build_model
from bench.host_timeline import SPECULATIVE, HostTimeline
from bench.profile_engine import print_idle_gaps
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.model.acceptance import AcceptanceRule, Verdict, acceptance_rule, register_rule
from tandemrl.engine.model.rejection import RejectionResult
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.speculative import DRAFT
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.engine.step import TARGET
from tandemrl.engine.block_manager import _note_blocks
from tandemrl.engine.sequence import Sequence
from tandemrl.types import Request, SamplingParams


TIMED_SEEDS = (2, 4, 5)  # the prompts of the timed runs (each time is the fastest of them)
PREFILL_SEEDS = (3, 6, 7)  # the prefill-only runs': other prompts, or the prefix cache would serve them


@dataclass
class FixedAcceptance:
    """BENCHMARK ONLY: keeps each proposal with probability ``rate`` (until the first miss) instead of the rejection
    rule, so the machinery can be timed at a controlled acceptance rate; the token after the kept ones is the
    target's argmax there."""

    rate: float
    tally: Tensor  # [2] on the device: proposals kept, and draws that missed (a round stops at its first miss)

    def __call__(self, v: Verdict) -> tuple[RejectionResult, None]:
        tokens, num_draft = v.tokens, v.num_proposals
        batch, width = tokens.shape
        keep = torch.rand(batch, width, device=tokens.device) < self.rate
        kept = keep.long().cumprod(1).sum(1).minimum(num_draft)
        self.tally += torch.stack((kept.sum(), (kept < num_draft).sum()))  # no host sync: read after the run
        position = torch.arange(width + 1, device=tokens.device)
        final = v.logits.argmax(-1).gather(1, kept[:, None])
        padded = torch.cat((tokens, tokens[:, :1]), 1)
        out = torch.where(position < kept[:, None], padded, final)
        return RejectionResult(out, torch.zeros(out.shape, device=out.device), kept), None


def fixed_acceptance(rate: float, device: torch.device) -> str:
    """The name of the registered fixed-acceptance rule at ``rate`` on ``device`` (registered on first use)."""
    name = f"bench-fixed-{rate}-{device}"
    try:
        acceptance_rule(name)
    except ValueError:
        register_rule(name, AcceptanceRule(FixedAcceptance(rate, torch.zeros(2, dtype=torch.long, device=device))))
    return name


def tally(engine: LLMEngine) -> Tensor:
    """[2] proposals kept and draws that missed so far under the engine's fixed-acceptance rule."""
    return acceptance_rule(engine.runner.acceptance).accept.tally


def run(engine: LLMEngine, prompts: list[list[int]], new_tokens: int, device: torch.device,
        draws: list[dict] | None = None) -> float:
    """Seconds to generate ``new_tokens`` for every prompt. ``draws`` gets what the run's acceptance draws gave, from
    the rollouts' telemetry: the slowest row's verify rounds over the rows' mean (the run lasts as long as its slowest
    row, which the model ignores) and the acceptance rate its draws realized (``FixedAcceptance.tally``)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    requests = [Request(str(i), p, params) for i, p in enumerate(prompts)]
    rollouts: list = []
    before = tally(engine).clone()
    seconds = timed(device, lambda: rollouts.extend(engine.generate(requests)))
    if draws is not None:
        rounds = [r.stats.verify_steps for r in rollouts]
        kept, missed = (tally(engine) - before).tolist()
        draws.append({"tail": max(rounds) * len(rounds) / sum(rounds), "a": kept / max(1, kept + missed)})
    return seconds


def stats_seconds_per_step(batch: int, k: int, repeats: int = 200) -> float:
    """Host time of one verify step's request-stats bookkeeping for ``batch`` rows (what postprocess and the block
    manager add per row)."""
    seqs = [Sequence(i, str(i), [1] * 100, 100, SamplingParams(), block_table=list(range(8))) for i in range(batch)]
    start = time.perf_counter()
    for step in range(repeats):
        for seq in seqs:
            stats = seq.stats
            if stats.first_token_time is None:
                stats.first_token_time = float(step)
            stats.record_verify(k, step % (k + 1))
            _note_blocks(seq)
    return (time.perf_counter() - start) / repeats


def profile_run(engine: LLMEngine, once) -> None:
    """Where a speculative run's time goes: the engine's host functions (timed one by one) and the device's idle
    gaps (torch.profiler)."""
    steps = engine.stats()["steps"]
    with HostTimeline(SPECULATIVE) as timeline:
        once()
    timeline.print(engine.stats()["steps"] - steps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        once()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    print_idle_gaps(prof)


def make_engine(models: dict, num_blocks: int, device: torch.device, spec: SpeculativeConfig | None,
                rate: float = 1.0) -> LLMEngine:
    runner = ModelRunner(models, EngineConfig(num_blocks=num_blocks), device,
                         acceptance=fixed_acceptance(rate, torch.device(device)))
    config = EngineConfig(num_blocks=num_blocks, max_num_seqs=256)
    return LLMEngine(runner, None, config, eos_ids=[], speculative=spec.for_engine() if spec is not None else None)


def graphs_captured(engine: LLMEngine) -> int:
    """CUDA graphs the engine's model slots hold."""
    return sum(len(slot.graphs.graphs) + len(slot.graphs.rounds) for slot in engine.runner.slots.values()
               if slot.graphs is not None)


def warm_up(engine: LLMEngine, once: Callable[[int], float], tries: int = 6) -> None:
    """Runs (prompt seeds 100, 101, ...) until one captures no new CUDA graph: the batch buckets a speculative run
    meets depend on its acceptance draws, and a capture inside a timed run costs more than the run."""
    for seed in range(100, 100 + tries):
        before = graphs_captured(engine)
        once(seed)
        if graphs_captured(engine) == before:
            return


def warm_up_smaller_batches(engine: LLMEngine, batch: int, args, vocab: int, device: torch.device) -> None:
    """A short run at every batch size below ``batch``: the rows of a speculative run finish at different times, and
    the smaller batches of its tail meet CUDA graph buckets of their own, captured here instead of in a timed run."""
    for size in range(1, batch):
        run(engine, random_prompts(size, args.prompt_len, vocab, 200 + size), 16, device)


def prefill_s(engine: LLMEngine, batch: int, args, vocab: int, device: torch.device) -> float:
    """Seconds of a run that stops after the prompts' prefill (one token each): what the timed runs take beyond
    their decode steps. The fastest of 3, as the timed runs: one slow prefill would otherwise shift the whole row (a
    run of 256 tokens takes ~0.3 s; a slow prefill run, tens of milliseconds more)."""
    return min(run(engine, random_prompts(batch, args.prompt_len, vocab, seed), 1, device) for seed in PREFILL_SEEDS)


def decode_step_s(model, batch: int, args, device: torch.device) -> float:
    """Per-token decode time of a plain engine over ``model`` (prefill excluded)."""
    engine = make_engine({TARGET: model}, args.num_blocks, device, None)
    vocab = model.config.vocab_size
    warm_up(engine, lambda seed: run(engine, random_prompts(batch, args.prompt_len, vocab, seed), args.new_tokens,
                                     device))
    # the fastest of the same 3 runs as the speculative timing: one estimator for all three times
    total = min(run(engine, random_prompts(batch, args.prompt_len, vocab, seed), args.new_tokens, device)
                for seed in TIMED_SEEDS)
    prefill = prefill_s(engine, batch, args, vocab, device)
    del engine
    release_garbage(device)
    return (total - prefill) / (args.new_tokens - 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-1.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--draft", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.6, 0.8, 0.9, 1.0])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=SpeculativeConfig().rounds,
                        help="verify rounds per launch (rollout.speculative.rounds)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/speculative.json"))
    parser.add_argument("--profile", action="store_true",
                        help="after each row, profile one more run: host (cProfile) and device idle gaps")
    return parser.parse_args(argv)


def measure(engine: LLMEngine, batch: int, k: int, rate: float, c: float, plain: float, args, vocab: int,
            device: torch.device, collections: FullCollections) -> dict:
    """One row: the speculative engine's time a token (the fastest of 3 warm runs) against the model's prediction."""
    prompts = functools.partial(random_prompts, batch, args.prompt_len, vocab)
    warm_up_smaller_batches(engine, batch, args, vocab, device)
    warm_up(engine, lambda seed: run(engine, prompts(seed), args.new_tokens, device))
    steps, graphs = engine.stats()["steps"], graphs_captured(engine)
    collections.take()
    # the fastest of 3 runs (fresh prompts each): a batch bucket first met in a timed run is captured in it
    draws: list[dict] = []
    times = [run(engine, prompts(seed), args.new_tokens, device, draws) for seed in TIMED_SEEDS]
    total = min(times)
    steps = (engine.stats()["steps"] - steps) / len(TIMED_SEEDS) - 1  # the verify launches (one prefill)
    captures = graphs_captured(engine) - graphs
    collected = collections.take()
    prefill = prefill_s(engine, batch, args, vocab, device)
    spec = (total - prefill) / (args.new_tokens - 1)
    # a launch records up to ``rounds`` verify rounds per row: its bookkeeping at most that many steps'
    telemetry = args.rounds * stats_seconds_per_step(batch, k) / ((total - prefill) / steps)
    predicted = (k + 1) / (k * c + 1) if rate >= 1 else (1 - rate ** (k + 1)) / ((1 - rate) * (k * c + 1))
    return {"batch": batch, "k": k, "a": rate, "c": c, "plain_ms": plain * 1e3, "spec_ms": spec * 1e3,
            "predicted": predicted, "achieved": plain / spec, "of_predicted": plain / spec / predicted,
            "telemetry_overhead": telemetry, "captures_in_timed_run": captures,
            "collections_in_timed_runs": collected,
            "slowest_row_rounds": sum(d["tail"] for d in draws) / len(draws),
            "realized_a_fastest_run": draws[times.index(total)]["a"],
            "realized_a_mean": sum(d["a"] for d in draws) / len(draws)}


def print_row(r: dict) -> None:
    print(f"batch {r['batch']} k {r['k']} a {r['a']:.1f} c {r['c']:.3f}: plain {r['plain_ms']:.2f} ms/token, spec "
          f"{r['spec_ms']:.2f}; predicted {r['predicted']:.2f}x, achieved {r['achieved']:.2f}x "
          f"({r['of_predicted']:.1%}), telemetry {r['telemetry_overhead']:.2%} of a launch; in the 3 timed runs "
          f"{r['captures_in_timed_run']} graph captures and {r['collections_in_timed_runs']}; slowest row "
          f"{r['slowest_row_rounds']:.2f}x the mean rounds; a realized {r['realized_a_fastest_run']:.3f} in the "
          f"fastest run ({r['realized_a_mean']:.3f} over the 3)", flush=True)


def print_table(rows: list[dict]) -> None:
    print("| batch | k | a | c | plain ms/token | spec ms/token | predicted | achieved | achieved/predicted | stats | "
          "slowest row's rounds / mean | a realized (fastest run) |")
    for r in rows:
        print(f"| {r['batch']} | {r['k']} | {r['a']:.1f} | {r['c']:.3f} | {r['plain_ms']:.2f} | {r['spec_ms']:.2f} | "
              f"{r['predicted']:.2f} | {r['achieved']:.2f} | {r['of_predicted']:.1%} | {r['telemetry_overhead']:.2%} | "
              f"{r['slowest_row_rounds']:.2f} | {r['realized_a_fastest_run']:.3f} |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = build_model(args.target, device, dtype, False).eval()
    draft = build_model(args.draft, device, dtype, False).eval()
    vocab = target.config.vocab_size
    collections = FullCollections()
    rows = []
    for batch in args.batches:
        plain = decode_step_s(target, batch, args, device)
        c = decode_step_s(draft, batch, args, device) / plain
        for k in args.ks:
            for rate in args.rates:
                torch.manual_seed(k)  # the fixed-acceptance draws
                engine = make_engine({TARGET: target, DRAFT: draft}, args.num_blocks, device,
                                     SpeculativeConfig(method="draft", num_tokens=k, rounds=args.rounds), rate)
                rows.append(measure(engine, batch, k, rate, c, plain, args, vocab, device, collections))
                if args.profile:
                    profile_run(engine, lambda: run(engine, random_prompts(batch, args.prompt_len, vocab, 2),
                                                    args.new_tokens, device))
                del engine
                release_garbage(device)  # this engine's cycles are freed here, not walked inside the next timing
                print_row(rows[-1])
    result = {"date": date.today().isoformat(), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "target": args.target, "draft": args.draft, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "rounds": args.rounds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(rows)


if __name__ == "__main__":
    main()
