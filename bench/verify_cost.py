"""What the target's verify forward costs against its plain decode step, on the device alone.

The standard model of speculative decoding (bench.speculative) counts a round as k draft steps plus ONE target step.
The verify forward reads k + 1 tokens a row: batch x (k + 1) rows through the same weights, k + 1 queries a sequence
in the attention, logits for every row. This times the target's column forward (the engine's: CUDA graphs where a
bucket holds the rows, a sequence's rows grouped in the attention) and its lm_head at batch rows (a plain step) and
at batch x (k + 1) rows (a verify round), over the same contexts, with CUDA events around back-to-back calls.

GPU:  python -m bench.verify_cost                         (Qwen2.5-1.5B architecture)
CPU:  python -m bench.verify_cost --target tiny --batches 2 --ks 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.model.slot import ModelSlot
from tandemrl.engine.step import TARGET


def seconds_per_call(fn, repeats: int, device: torch.device) -> float:
    """Mean seconds of ``fn()`` over ``repeats`` back-to-back calls, after three warm-up calls (captures)."""
    for _ in range(3):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / repeats


def forward_and_logits_s(runner: ModelRunner, slot: ModelSlot, batch: int, per_row: int, context: int,
                         repeats: int, vocab: int) -> tuple[float, float]:
    """(column forward, lm_head) seconds for ``batch`` sequences of ``context`` tokens reading ``per_row`` new tokens
    each (1: a plain step; k + 1: a verify round), their K/V written to their own blocks."""
    block_size, device = runner.block_size, runner.device
    width = -(-(context + per_row) // block_size)
    table = torch.arange(batch * width, device=device).view(batch, width)
    seq = np.repeat(np.arange(batch), per_row)
    positions = torch.from_numpy(context - 1 + np.tile(np.arange(per_row), batch)).to(device)
    rows = torch.from_numpy(seq).to(device)
    slots = table[rows, positions // block_size] * block_size + positions % block_size
    columns = torch.stack((positions, slots, positions + 1))
    forward = slot.column_forward(table[rows], seq if per_row > 1 else None)
    ids = torch.randint(vocab, (len(seq),), device=device)
    hidden = forward(ids, columns)
    return (seconds_per_call(lambda: forward(ids, columns), repeats, device),
            seconds_per_call(lambda: slot.logits(hidden), repeats, device))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-1.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--context", type=int, default=256, help="tokens a sequence holds (prompt + half the output)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("bench/out/verify_cost.json"))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.target, device, torch.bfloat16 if device.type == "cuda" else torch.float32, False).eval()
    vocab = model.config.vocab_size
    config = EngineConfig()
    runner = ModelRunner({TARGET: model}, config, device)
    runner.allocate_kv_cache(max(args.batches) * (max(args.ks) + 1) * (-(-(args.context + 8) // config.block_size)))
    slot = runner.slots[TARGET]
    rows = []
    print("| batch | k | plain step: forward, lm_head (us) | verify: forward, lm_head (us) | verify / plain |")
    with torch.inference_mode():
        for batch in args.batches:
            plain = forward_and_logits_s(runner, slot, batch, 1, args.context, args.repeats, vocab)
            for k in args.ks:
                verify = forward_and_logits_s(runner, slot, batch, k + 1, args.context, args.repeats, vocab)
                ratio = sum(verify) / sum(plain)
                rows.append({"batch": batch, "k": k, "plain_forward_us": plain[0] * 1e6,
                             "plain_logits_us": plain[1] * 1e6, "verify_forward_us": verify[0] * 1e6,
                             "verify_logits_us": verify[1] * 1e6, "verify_over_plain": ratio})
                print(f"| {batch} | {k} | {plain[0] * 1e6:.0f}, {plain[1] * 1e6:.0f} | {verify[0] * 1e6:.0f}, "
                      f"{verify[1] * 1e6:.0f} | {ratio:.3f} |", flush=True)
    result = {"date": date.today().isoformat(), "torch": torch.__version__, "target": args.target,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "context": args.context, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
