"""Multi-turn tool-calling rollouts: the asynchronous agent loop vs the batch-synchronous turn loop.

N trajectories; each makes a seeded random number of tool calls (1..--max-calls), each call sleeps a seeded random
--tool-min-ms..--tool-max-ms (uniform, or long-tailed with --tool-dist lognormal), and each turn (the calls' turns
and the final one) decodes a seeded random
--turn-tokens-min..--turn-tokens-max tokens (EOS ignored). The same script, prompts and sampling seed serve both
loops, on the same engine. The model's text is not parsed: every turn is scripted to be a call (``ScriptedCalls``)
until the trajectory's own call budget ends it. The synchronous baseline runs a turn's tools concurrently (a thread
each) and then waits for all of them, as batch "generate -> call all tools -> generate" loops do.

The printed bound: the async loop cannot finish before its slowest trajectory's own tools and turns back to back;
the synchronous loop pays, every turn, the slowest live tool and the longest live turn. Their quotient
(``ratio_bound``, with a decode step costing the same at any batch size) is what the async loop can gain on this
script; with free decoding it is the tools' quotient alone (``ratio_bound_tools_only``).

CPU (tiny random model):  python -m bench.agent_loop --arch tiny
GPU:                      python -m bench.agent_loop --arch qwen2.5-0.5b --turn-tokens-min 32 --turn-tokens-max 512 \
                              --prompt-len 256 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import statistics
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Sequence

import torch

from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.rollout.tool_format import ToolCall
from tandemrl.rollout.tools import ToolContext, ToolRegistry, ToolResult, make_tool
from tandemrl.rollout.trajectory import AgentLimits, TrajectorySpec, TrajectoryState
from tandemrl.types import Request, SamplingParams, Trajectory

LOOPS = ("async", "turn-synchronous")


@dataclass(frozen=True)
class Script:
    """One trajectory's workload: its tool calls' delays (s) and the tokens each of its turns decodes."""

    delays: tuple[float, ...]
    turn_tokens: tuple[int, ...]  # len(delays) + 1 turns


def make_scripts(args: argparse.Namespace) -> list[Script]:
    rng = random.Random(args.seed)
    scripts = []
    for _ in range(args.trajectories):
        calls = rng.randint(1, args.max_calls)
        delays = tuple(tool_delay(rng, args) for _ in range(calls))
        tokens = tuple(rng.randint(args.turn_tokens_min, args.turn_tokens_max) for _ in range(calls + 1))
        scripts.append(Script(delays, tokens))
    return scripts


def tool_delay(rng: random.Random, args: argparse.Namespace) -> float:
    """One call's delay (s): uniform in --tool-min-ms..--tool-max-ms, or long-tailed (lognormal: the geometric
    mean of the two as its median, the two as its 1st and 99th percentiles, clipped to them)."""
    low, high = args.tool_min_ms / 1e3, args.tool_max_ms / 1e3
    if args.tool_dist == "uniform":
        return rng.uniform(low, high)
    sigma = math.log(high / low) / (2 * 2.326)
    return min(high, max(low, rng.lognormvariate(math.log(math.sqrt(low * high)), sigma)))


@dataclass(frozen=True)
class ScriptedCalls:
    """A tool format for which every turn is one call of ``sleep`` (the trajectory's call budget ends it)."""

    stop: tuple[str, ...] = ()

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall("sleep")]

    def result_text(self, results: Sequence[ToolResult], turn_ended: bool) -> str:
        return "".join(r.text for r in results)


@dataclass
class ScriptedTrajectory(TrajectoryState):
    """A trajectory whose turns decode the lengths its script says."""

    turn_tokens: tuple[int, ...] = ()

    def next_request(self) -> Request:
        request = super().next_request()
        return dataclasses.replace(request, params=dataclasses.replace(request.params,
                                                                       max_tokens=self.turn_tokens[self.turns]))


class ScriptedLoop(AgentLoop):
    """The agent loop (both drivers unchanged) over scripted trajectories: per-trajectory call budgets and turn
    lengths."""

    def __init__(self, *args, scripts: dict[str, Script], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scripts = scripts

    def _states(self, specs: Sequence[TrajectorySpec], policy_version: int) -> list[TrajectoryState]:
        states = []
        for spec in specs:
            script = self.scripts[spec.traj_id]
            limits = AgentLimits(len(script.delays) + 1, len(script.delays), self.limits.max_total_tokens)
            states.append(ScriptedTrajectory(spec, self.fmt, limits, policy_version, turn_tokens=script.turn_tokens))
        return states


class IdTokenizer:
    """Text <-> ids for a model without a tokenizer: results become fixed ids, outputs their id numbers."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [10 + ord(c) % 100 for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def sleep(context: ToolContext) -> str:
    """Sleeps for this trajectory's next delay."""
    time.sleep(context.columns["delays"].pop(0))
    return "result:" + "x" * 8


def make_specs(scripts: dict[str, Script], prompt_len: int, vocab: int, seed: int, run: int) -> list[TrajectorySpec]:
    """Prompts differ per run (``run``) so that no run reuses another's cached prefix; the scripts are the same."""
    prompts = torch.Generator().manual_seed(seed * 1000 + run)
    params = SamplingParams(max_tokens=1 << 20, temperature=1.0, ignore_eos=True, seed=seed)  # the script cuts turns
    return [TrajectorySpec(name, torch.randint(0, vocab, (prompt_len,), generator=prompts).tolist(), params,
                           ToolContext({"delays": list(s.delays)})) for name, s in scripts.items()]


def ratio_bound(scripts: list[Script], seconds_per_token: float) -> float:
    """Synchronous over asynchronous wall time if each loop ran at its own critical path: turn by turn, the slowest
    live tool plus the longest live turn, vs the slowest trajectory's own tools and turns back to back (decode time
    ``seconds_per_token`` per token, whatever the batch; 0: tools only)."""
    synchronous = 0.0
    for turn in range(max(len(s.turn_tokens) for s in scripts)):
        live = [s for s in scripts if turn < len(s.turn_tokens)]
        synchronous += seconds_per_token * max(s.turn_tokens[turn] for s in live)
        synchronous += max((s.delays[turn] for s in live if turn < len(s.delays)), default=0.0)
    asynchronous = max(sum(s.delays) + seconds_per_token * sum(s.turn_tokens) for s in scripts)
    return synchronous / asynchronous


def longest_turns(scripts: list[Script]) -> int:
    """Decode steps the synchronous loop needs at least: the longest live turn, turn after turn."""
    turns = max(len(s.turn_tokens) for s in scripts)
    return sum(max(s.turn_tokens[k] for s in scripts if k < len(s.turn_tokens)) for k in range(turns))


def measure(loop: AgentLoop, backend: EngineBackend, specs: list[TrajectorySpec], name: str,
            device: torch.device) -> dict:
    backend.engine.invalidate_prefix_cache()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with backend.generating():
        trajectories = (loop.run if name == "async" else loop.run_turn_synchronous)(specs)
    times = loop.times
    generated = sum(t.rollout.stats.generated_tokens for t in trajectories)
    return {"loop": name, "wall_s": times.wall_s, "trajectories_per_s": len(trajectories) / times.wall_s,
            "generated_tok_s": generated / times.wall_s, "engine_busy_fraction": times.busy_fraction,
            "engine_busy_s": times.engine_busy_s, "generated_tokens": generated,
            "tool_calls": sum(len(t.tool_calls) for t in trajectories),
            "reprefill_tokens": sum(t.reprefill_tokens for t in trajectories), "check": check(trajectories)}


def check(trajectories: list[Trajectory]) -> str:
    calls = {len(t.tool_calls) for t in trajectories}
    reasons = {t.rollout.finish_reason for t in trajectories}
    return f"calls per trajectory {sorted(calls)}, finish {sorted(reasons)}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="tiny", choices=sorted(ARCHITECTURES))
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--max-calls", type=int, default=4, help="tool calls per trajectory: random in 1..this")
    parser.add_argument("--tool-min-ms", type=float, default=50.0)
    parser.add_argument("--tool-max-ms", type=float, default=500.0)
    parser.add_argument("--tool-dist", choices=("uniform", "lognormal"), default="uniform",
                        help="tool delays: uniform, or long-tailed (lognormal) between --tool-min-ms and --tool-max-ms")
    parser.add_argument("--turn-tokens-min", type=int, default=4, help="tokens a turn decodes: random in min..max")
    parser.add_argument("--turn-tokens-max", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each loop (alternating); medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/agent_loop.json"))
    args = parser.parse_args(argv)
    if not (1 <= args.turn_tokens_min <= args.turn_tokens_max and args.max_calls >= 1):
        parser.error("need 1 <= --turn-tokens-min <= --turn-tokens-max and --max-calls >= 1")
    return args


def build_backend(arch: str, kv_gib: float, device: torch.device) -> EngineBackend:
    if device.type == "cpu":
        torch.set_num_threads(1)  # as training does for small models (tandemrl/train/setup.py)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(arch, device, dtype, gradient_checkpointing=False).eval()
    probe = EngineBackend(model, None, EngineConfig(num_blocks=1, cuda_graphs=device.type == "cuda"), device=device)
    num_blocks = int(kv_gib * 2**30 // probe.runner.bytes_per_block(16))
    probe.close()
    return EngineBackend(model, None, EngineConfig(num_blocks=num_blocks, cuda_graphs=device.type == "cuda"),
                         device=device)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = build_backend(args.arch, args.kv_gib, device)
    scripts = make_scripts(args)
    by_id = {f"traj{i}": s for i, s in enumerate(scripts)}
    warm_up = {f"warm{i}": Script((0.001,), (args.turn_tokens_max,) * 2) for i in range(8)}
    loop = ScriptedLoop(backend.engine, IdTokenizer(), ScriptedCalls(), ToolRegistry([make_tool(sleep)]),
                        AgentLimits(max_total_tokens=1 << 20), max_concurrent_tools=args.trajectories,
                        scripts={**by_id, **warm_up})
    vocab = backend.model.config.vocab_size
    measure(loop, backend, make_specs(warm_up, args.prompt_len, vocab, args.seed, run=999), "async",
            device)  # compile / capture before timing
    runs = []
    for repeat in range(args.repeats):
        for i, name in enumerate(LOOPS):
            runs.append(measure(loop, backend, make_specs(by_id, args.prompt_len, vocab, args.seed, 2 * repeat + i),
                                name, device))
            print(f"{name:>16}: {runs[-1]['wall_s']:.2f} s, busy {runs[-1]['engine_busy_fraction']:.2f},"
                  f" {runs[-1]['check']}", flush=True)
    backend.close()
    result = summarise(args, scripts, runs, device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    return result


def summarise(args: argparse.Namespace, scripts: list[Script], runs: list[dict], device: torch.device) -> dict:
    summary = {name: {key: statistics.median(r[key] for r in runs if r["loop"] == name)
                      for key in ("wall_s", "trajectories_per_s", "generated_tok_s", "engine_busy_fraction",
                                  "engine_busy_s")} for name in LOOPS}
    ratio = summary["async"]["trajectories_per_s"] / summary["turn-synchronous"]["trajectories_per_s"]
    # Decode time per token, from the synchronous loop: its engine time over the decode steps it needed at least.
    seconds_per_token = summary["turn-synchronous"]["engine_busy_s"] / longest_turns(scripts)
    return {"date": date.today().isoformat(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
            "summary": summary, "throughput_ratio": ratio,
            "calls_per_trajectory": statistics.mean(len(s.delays) for s in scripts),
            "slowest_trajectory_tools_s": max(sum(s.delays) for s in scripts),
            "seconds_per_token": seconds_per_token, "ratio_bound_tools_only": ratio_bound(scripts, 0.0),
            "ratio_bound": ratio_bound(scripts, seconds_per_token)}


def print_table(result: dict) -> None:
    print("| loop | wall s | trajectories/s | generated tok/s | engine busy |")
    print("|---|---|---|---|---|")
    for name, row in result["summary"].items():
        print(f"| {name} | {row['wall_s']:.2f} | {row['trajectories_per_s']:.1f} | {row['generated_tok_s']:.0f} | "
              f"{row['engine_busy_fraction']:.2f} |")
    print(f"async / turn-synchronous throughput: {result['throughput_ratio']:.2f}x; critical-path bound for this "
          f"script: {result['ratio_bound']:.2f}x ({result['seconds_per_token'] * 1e3:.1f} ms per decode step), "
          f"{result['ratio_bound_tools_only']:.2f}x with free decoding")


if __name__ == "__main__":
    main()
