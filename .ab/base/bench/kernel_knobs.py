"""Per-step time of a decode burst (wall clock, host work included) under settings of the engine's kernel knobs,
at batches 1, 8, 64 and 256 with a 384-token context, beside the bandwidth floor. GPU only.

python -m bench.kernel_knobs                 # every setting below
python -m bench.kernel_knobs base steps16    # some of them
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.decode_breakdown import prefilled, wall_ms
from bench.engine_throughput import decode_floor_s, measured_bandwidth, random_prompts
from bench.grpo_step import build_model
from tandemrl.engine import fused_linear, triton_attention
from tandemrl.engine.model_runner import ModelRunner

# name -> ({(module, constant): value}, decode steps per burst)
SETTINGS: dict[str, tuple[dict[tuple[object, str], object], int]] = {
    "base": ({}, 8),
    "steps16": ({}, 16),
    "attention_block128": ({(triton_attention, "_DECODE_BLOCK_N"): 128}, 8),
    "attention_waves4": ({(triton_attention, "_SPLIT_TARGET_WAVES"): 4}, 8),
    "grouped_rows64": ({(fused_linear, "GROUPED_LINEAR_MAX_ROWS"): 64}, 8),
    "grouped_rows16": ({(fused_linear, "GROUPED_LINEAR_MAX_ROWS"): 16}, 8),
}
BATCHES = (1, 8, 64, 256)
CONTEXT = 384


def burst_ms(model, batch: int, steps: int) -> float:
    runner = ModelRunner(model, "cuda", 16)
    runner.allocate_kv_cache(batch * -(-(CONTEXT + 1024) // 16))
    seqs = prefilled(runner, random_prompts(batch, CONTEXT, model.config.vocab_size, batch), 16)
    runner.decode(seqs, [steps] * batch)  # capture and compile
    best = min(wall_ms(lambda: runner.decode(seqs, [steps] * batch), 5) for _ in range(3)) / steps
    runner.free_kv_cache()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("settings", nargs="*", help=f"any of {', '.join(SETTINGS)} (default: all)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/kernel_knobs.json"))
    args = parser.parse_args()
    unknown = set(args.settings) - set(SETTINGS)
    if unknown:
        parser.error(f"unknown settings {sorted(unknown)}; choose from {', '.join(SETTINGS)}")
    model = build_model("qwen2.5-0.5b", torch.device("cuda"), torch.bfloat16, False).eval()
    bandwidth = measured_bandwidth(torch.device("cuda"))
    defaults = {key: getattr(*key) for overrides, _ in SETTINGS.values() for key in overrides}
    results = {}
    for name in args.settings or list(SETTINGS):
        overrides, steps = SETTINGS[name]
        for (module, constant), value in {**defaults, **overrides}.items():
            setattr(module, constant, value)
        row = {}
        for batch in BATCHES:
            ms = burst_ms(model, batch, steps)
            row[batch] = {"step_ms": ms, "over_floor": ms / (decode_floor_s(model, batch, CONTEXT, 0, bandwidth) * 1e3)}
        results[name] = row
        print(name, {b: f"{r['step_ms']:.3f} ms ({r['over_floor']:.2f}x)" for b, r in row.items()}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
