"""Multi-turn tool-calling rollouts: the asynchronous agent loop vs the batch-synchronous turn loop.

N trajectories, each making --calls tool calls; each call sleeps a seeded random --tool-min-ms..--tool-max-ms
(the same delays, prompts and sampling seed for both loops, on the same engine). The model's text is not parsed:
every turn is scripted to be a call (``ScriptedCalls``), each turn decodes exactly --turn-tokens tokens, so both
loops do the same engine work. The synchronous baseline runs a turn's tools concurrently (a thread each) and then
waits for all of them, as batch "generate -> call all tools -> generate" loops do.

CPU (tiny random model):  python -m bench.agent_loop --arch tiny
GPU:                      python -m bench.agent_loop --arch qwen2.5-0.5b --turn-tokens 128 --prompt-len 256
"""

from __future__ import annotations

import argparse
import json
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
from tandemrl.rollout.trajectory import AgentLimits, TrajectorySpec
from tandemrl.types import SamplingParams, Trajectory


@dataclass(frozen=True)
class ScriptedCalls:
    """A tool format for which every turn is one call of ``sleep`` (the call limit ends each trajectory)."""

    stop: tuple[str, ...] = ()

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall("sleep")]

    def result_text(self, results: Sequence[ToolResult], turn_ended: bool) -> str:
        return "".join(r.text for r in results)


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


def make_specs(n: int, calls: int, prompt_len: int, vocab: int, turn_tokens: int, low_ms: float, high_ms: float,
               seed: int, run: int) -> list[TrajectorySpec]:
    """The same delays for every run; prompts differ per run (``run``) so no run reuses another's cached prefix."""
    delays = random.Random(seed)
    prompts = torch.Generator().manual_seed(seed * 1000 + run)
    specs = []
    for i in range(n):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=prompts).tolist()
        wait = [delays.uniform(low_ms, high_ms) / 1e3 for _ in range(calls)]
        params = SamplingParams(max_tokens=turn_tokens, temperature=1.0, ignore_eos=True, seed=seed)
        specs.append(TrajectorySpec(f"traj{i}", prompt, params, ToolContext({"delays": wait})))
    return specs


def measure(loop: AgentLoop, backend: EngineBackend, specs: list[TrajectorySpec], synchronous: bool,
            device: torch.device) -> dict:
    backend.engine.invalidate_prefix_cache()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with backend.generating():
        trajectories = (loop.run_turn_synchronous if synchronous else loop.run)(specs)
    times = loop.times
    generated = sum(t.rollout.stats.generated_tokens for t in trajectories)
    return {"loop": "turn-synchronous" if synchronous else "async", "wall_s": times.wall_s,
            "trajectories_per_s": len(trajectories) / times.wall_s, "generated_tok_s": generated / times.wall_s,
            "engine_busy_fraction": times.busy_fraction, "engine_busy_s": times.engine_busy_s,
            "tool_calls": sum(len(t.tool_calls) for t in trajectories),
            "reprefill_tokens": sum(t.reprefill_tokens for t in trajectories), "check": check(trajectories)}


def check(trajectories: list[Trajectory]) -> str:
    calls = {len(t.tool_calls) for t in trajectories}
    reasons = {t.rollout.finish_reason for t in trajectories}
    return f"calls per trajectory {sorted(calls)}, finish {sorted(reasons)}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="tiny", choices=sorted(ARCHITECTURES))
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--calls", type=int, default=4, help="tool calls per trajectory")
    parser.add_argument("--tool-min-ms", type=float, default=50.0)
    parser.add_argument("--tool-max-ms", type=float, default=500.0)
    parser.add_argument("--turn-tokens", type=int, default=16, help="tokens each turn decodes (EOS ignored)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each loop (alternating); medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/agent_loop.json"))
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # as training does for small models (tandemrl/train/setup.py)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False).eval()
    probe = EngineBackend(model, None, EngineConfig(num_blocks=1, cuda_graphs=device.type == "cuda"), device=device)
    num_blocks = int(args.kv_gib * 2**30 // probe.runner.bytes_per_block(16))
    probe.close()
    backend = EngineBackend(model, None, EngineConfig(num_blocks=num_blocks, cuda_graphs=device.type == "cuda"),
                            device=device)
    loop = AgentLoop(backend.engine, IdTokenizer(), ScriptedCalls(), ToolRegistry([make_tool(sleep)]),
                     AgentLimits(max_turns=args.calls + 1, max_tool_calls=args.calls, max_total_tokens=1 << 20),
                     max_concurrent_tools=args.trajectories)
    vocab = model.config.vocab_size

    def specs(run: int) -> list[TrajectorySpec]:
        return make_specs(args.trajectories, args.calls, args.prompt_len, vocab, args.turn_tokens, args.tool_min_ms,
                          args.tool_max_ms, args.seed, run)

    warm = make_specs(8, 1, args.prompt_len, vocab, args.turn_tokens, 1.0, 2.0, args.seed, run=999)
    measure(loop, backend, warm, synchronous=False, device=device)  # compile / capture before timing
    runs = []
    for repeat in range(args.repeats):
        for synchronous in (False, True):
            runs.append(measure(loop, backend, specs(2 * repeat + synchronous), synchronous, device))
            print(f"{runs[-1]['loop']:>16}: {runs[-1]['wall_s']:.2f} s, busy {runs[-1]['engine_busy_fraction']:.2f},"
                  f" {runs[-1]['check']}", flush=True)
    backend.close()

    def median(loop_name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["loop"] == loop_name)

    ideal = max(sum(s.context.columns["delays"]) for s in specs(0))  # the slowest trajectory's tools, back to back
    summary = {name: {key: median(name, key) for key in ("wall_s", "trajectories_per_s", "generated_tok_s",
                                                         "engine_busy_fraction")}
               for name in ("async", "turn-synchronous")}
    ratio = summary["async"]["trajectories_per_s"] / summary["turn-synchronous"]["trajectories_per_s"]
    result = {"date": date.today().isoformat(),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
              "summary": summary, "throughput_ratio": ratio, "slowest_trajectory_tools_s": ideal}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| loop | wall s | trajectories/s | generated tok/s | engine busy |")
    print("|---|---|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} | {row['wall_s']:.2f} | {row['trajectories_per_s']:.1f} | {row['generated_tok_s']:.0f} | "
              f"{row['engine_busy_fraction']:.2f} |")
    print(f"async / turn-synchronous throughput: {ratio:.2f}x  (the slowest trajectory's own tool time: {ideal:.2f} s)")
    return result


if __name__ == "__main__":
    main()
