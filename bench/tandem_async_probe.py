"""Probe: a tandem rollout's time, engine steps and CUDA graph captures with asynchronous scheduling on and off.

python -m bench.tandem_async_probe --new-tokens 128
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from bench.engine_throughput import random_prompts
from bench.grpo_step import ARCHITECTURES, build_model
from bench.speculative import graphs_captured
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.tandem.config import TandemConfig
from tandemrl.types import Request, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen3-0.6b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, False).eval()
    frozen = copy.deepcopy(model)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    for async_scheduling in (False, True):
        backend = EngineBackend(model, None, EngineConfig(num_blocks=4096, async_scheduling=async_scheduling),
                                device=device, tandem=TandemConfig(enabled=True, p=0.5), frozen_model=frozen)
        engine = backend.engine
        for run in range(args.runs):
            prompts = random_prompts(args.batch, 128, model.config.vocab_size, seed=run)
            steps, graphs = engine.stats()["steps"], graphs_captured(engine)
            torch.cuda.synchronize() if device.type == "cuda" else None
            start = time.perf_counter()
            backend.generate([Request(str(i), p, params) for i, p in enumerate(prompts)])
            torch.cuda.synchronize() if device.type == "cuda" else None
            print(f"async {async_scheduling} run {run}: {time.perf_counter() - start:.2f} s, "
                  f"{engine.stats()['steps'] - steps} steps, {graphs_captured(engine) - graphs} captures", flush=True)
        backend.close()


if __name__ == "__main__":
    main()
