"""Where the host's time goes in a warm speculative run: cProfile of one engine run per configuration, after warm-up
runs until one captures no new CUDA graph (a capture in the profiled run is reported). Same pairs as
bench.speculative: Qwen2.5-1.5B-architecture target, Qwen2.5-0.5B-architecture draft, random bf16 weights,
128-token prompts, 256 new tokens, greedy, acceptance fixed by its benchmark-only FixedAcceptance rule.

GPU:  python -m bench.speculative_cprofile [--configs 1,2,0.8 8,4,0.6] [--lines 60]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from bench.grpo_step import build_model
from bench.speculative import graphs_captured, make_engine, random_prompts, run
from tandemrl.engine.speculative import DRAFT
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.engine.step import TARGET


def profile_config(models: dict, batch: int, k: int, rate: float, lines: int, device: torch.device) -> None:
    torch.manual_seed(k)  # the fixed-acceptance draws
    engine = make_engine(models, 4096, device, SpeculativeConfig(method="draft", num_tokens=k), rate)
    vocab = models[TARGET].config.vocab_size

    def once(seed: int) -> float:
        return run(engine, random_prompts(batch, 128, vocab, seed), 256, device)

    for seed in range(100, 108):  # until a run captures nothing
        before = graphs_captured(engine)
        once(seed)
        if graphs_captured(engine) == before:
            break
    steps, graphs = engine.stats()["steps"], graphs_captured(engine)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds = once(seed)
    profiler.disable()
    steps = engine.stats()["steps"] - steps
    print(f"== batch {batch} k {k} a {rate}: {seconds * 1e3:.1f} ms under cProfile, {steps} steps, "
          f"{seconds / steps * 1e3:.2f} ms/step, {graphs_captured(engine) - graphs} captures in the profiled run")
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(lines)
        print(text.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["1,2,0.8", "8,4,0.6"], help="batch,k,a each")
    parser.add_argument("--lines", type=int, default=60)
    args = parser.parse_args()
    device = torch.device("cuda")
    models = {TARGET: build_model("qwen2.5-1.5b", device, torch.bfloat16, False).eval(),
              DRAFT: build_model("qwen2.5-0.5b", device, torch.bfloat16, False).eval()}
    for config in args.configs:
        batch, k, rate = config.split(",")
        profile_config(models, int(batch), int(k), float(rate), args.lines, device)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
