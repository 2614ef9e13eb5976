"""Split-K of the grouped q/k/v launch (linear_tiles.gemv_split_k) at one architecture's shapes, on a GPU: each
row count's q/k/v over all layers (a CUDA graph, µs per layer, weights streaming from HBM) with the engine's tiles
cut into 1-4 parts of K, beside cuBLAS, each output checked against the unsplit launch's.

python -m bench.split_k_probe --arch qwen2.5-7b --rows 1 16 64
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from bench.grpo_step import ARCHITECTURES, build_model
from bench.kernel_sweep import per_layer_us
from bench.linear_roofline import layer_shapes, peak_for
from tandemrl.engine.kernels import fused_linear, linear_tiles


def probe_rows(layers, config: dict, rows: int, sms: int, peak) -> dict:
    """µs per layer of cuBLAS's three GEMMs and of our launch at each split, with the largest difference to the
    unsplit launch's output (bf16: the parts add in another order)."""
    attn = [layer.self_attn for layer in layers]
    shape = next(s for s in layer_shapes(config, rows, attn[0].q_proj.bias is not None) if s.name == "qkv")
    engine = linear_tiles.pick_tiles(rows, shape.widths, shape.k, 2, 1, sms)
    x = torch.randn(rows, shape.k, device="cuda", dtype=torch.bfloat16)
    lin = torch.nn.functional.linear
    out = {"rows": rows, "engine_tiles": vars(engine), "floor_us": shape.floor_us(peak) if peak else None,
           "cublas_us": per_layer_us(lambda a: [lin(x, p.weight, p.bias) for p in (a.q_proj, a.k_proj, a.v_proj)],
                                     attn)}
    reference = torch.cat(fused_linear.qkv_projection(attn[0], x, tiles=replace(engine, split_k=1)), dim=-1)
    for split in (1, 2, 3, 4):
        tiles = replace(engine, split_k=split)
        got = torch.cat(fused_linear.qkv_projection(attn[0], x, tiles=tiles), dim=-1)
        out[f"split_{split}"] = {
            "us": per_layer_us(lambda a: fused_linear.qkv_projection(a, x, tiles=tiles), attn),
            "max_abs_diff": float((got.float() - reference.float()).abs().max()),
            "ref_max_abs": float(reference.float().abs().max())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-7b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", type=Path, default=Path("bench/out/split_k_probe.json"))
    args = parser.parse_args()
    model = build_model(args.arch, torch.device("cuda"), torch.bfloat16, False, init_on_device=True).eval()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config, peak = ARCHITECTURES[args.arch], peak_for(torch.cuda.get_device_name())
    with torch.inference_mode():
        results = [probe_rows(list(model.model.layers), config, rows, sms, peak) for rows in args.rows]
    for r in results:
        splits = " ".join(f"{s}: {r[f'split_{s}']['us']:.1f}" for s in (1, 2, 3, 4))
        print(f"rows {r['rows']}: engine split {r['engine_tiles']['split_k']}, cuBLAS {r['cublas_us']:.1f} us, "
              f"ours by split {splits} us, floor {r['floor_us']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "arch": args.arch,
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
