"""Decode attention at batch 256 (Qwen2.5-0.5B shapes, 24 layers): KV layout x tile knobs of the single-pass
Triton kernel, timed per layer over a CUDA graph (bench.kernel_sweep.per_layer_us). GPU only.

The kernel reads the cache through its strides, so the head-major layout [blocks, heads, slots, dim] is probed as a
permuted view with no kernel change. Block tables are a random permutation (a long-running pool is scattered).

python -m bench.attention_probe --context 384
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from bench.kernel_sweep import per_layer_us
from tandemrl.engine import triton_attention


def caches_for(layout: str, blocks: int, layers: int) -> list[torch.Tensor]:
    shape = {"slot_major": (blocks, 16, 2, 64), "head_major": (blocks, 2, 16, 64)}[layout]
    out = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2 * layers)]
    return out if layout == "slot_major" else [c.permute(0, 2, 1, 3) for c in out]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=384)
    parser.add_argument("--out", type=Path, default=Path("bench/out/attention_probe.json"))
    args = parser.parse_args()
    layers, batch, width = 24, args.batch, -(-args.context // 16)
    gen = torch.Generator().manual_seed(0)
    tables = torch.randperm(batch * width, generator=gen).view(batch, width).cuda()
    ctx = torch.full((batch,), args.context, device="cuda")
    q = torch.randn(batch, 14, 64, device="cuda", dtype=torch.bfloat16)
    kv_mb = 2 * batch * args.context * 2 * 64 * 2 / 1e6
    knobs = ("_SINGLE_PASS_BLOCK_N", "_DECODE_WARPS", "_SINGLE_PASS_STAGES")
    original = {k: getattr(triton_attention, k) for k in knobs}
    results = {}
    for layout in ("slot_major", "head_major"):
        caches = caches_for(layout, batch * width, layers)
        reference = triton_attention.triton_paged_decode(q, caches[0], caches[1], tables, ctx, 0.125, None)
        for bn, warps, stages in itertools.product((64, 128, 256), (4, 8), (2, 3, 4)):
            for knob, value in zip(knobs, (bn, warps, stages)):
                setattr(triton_attention, knob, value)
            name = f"{layout} {bn}/{warps}/{stages}"
            try:
                out = triton_attention.triton_paged_decode(q, caches[0], caches[1], tables, ctx, 0.125, None)
                err = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
                us = per_layer_us(lambda i: triton_attention.triton_paged_decode(
                    q, caches[2 * i], caches[2 * i + 1], tables, ctx, 0.125, None), range(layers))
            except Exception as exc:  # out of shared memory at large tiles
                print(f"{name}: {type(exc).__name__}", flush=True)
                continue
            results[name] = {"us": us, "rel_err": err, "gb_s": kv_mb / us * 1e3}
            print(f"{name}: {us:.2f} us  {kv_mb / us * 1e3:.0f} GB/s  err {err:.1e}", flush=True)
        for knob, value in original.items():
            setattr(triton_attention, knob, value)
        for splits in (2, 4):
            us = per_layer_us(lambda i: triton_attention.triton_paged_decode(
                q, caches[2 * i], caches[2 * i + 1], tables, ctx, 0.125, None, num_splits=splits), range(layers))
            results[f"{layout} default split{splits}"] = {"us": us}
            print(f"{layout} default split{splits}: {us:.2f} us", flush=True)
        del caches
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"batch": batch, "context": args.context, "kv_mb_per_layer": kv_mb,
                                    "device": torch.cuda.get_device_name(), "results": results}, indent=1))
    best = sorted(results.items(), key=lambda kv: kv[1]["us"])[:6]
    print(f"KV {kv_mb:.1f} MB per layer; fastest: " + "; ".join(f"{k} {v['us']:.2f}" for k, v in best))


if __name__ == "__main__":
    main()
