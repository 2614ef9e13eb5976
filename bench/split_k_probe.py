"""Split-K of the grouped launch (linear_tiles.gemv_split_k) at one architecture's shapes, on a GPU: q/k/v, o and
down at each row count over all layers (a CUDA graph, µs per layer, weights streaming from HBM) with the engine's
tiles cut into 1-4 parts of K, beside cuBLAS, each output checked against the unsplit launch's.

python -m bench.split_k_probe --arch qwen2.5-7b --rows 1 16 64 --ops qkv o down
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from bench.grpo_step import ARCHITECTURES, build_model
from bench.kernel_sweep import Variant, _ours_single, per_layer_us
from bench.linear_roofline import layer_shapes, peak_for
from tandemrl.engine.kernels import fused_linear, linear_tiles


def _launcher(op: str, tiles):
    """(module, x) -> our launch's output with these tiles: q/k/v as the engine runs it; o/down as the grouped
    launch of one weight (the engine gives them to cuBLAS: the question is whether split-K changes that)."""
    if op == "qkv":
        return lambda attn, x: torch.cat(fused_linear.qkv_projection(attn, x, tiles=tiles), dim=-1)
    return lambda module, x: _ours_single(module, x, Variant(tiles))


def probe(layers, config: dict, op: str, rows: int, sms: int, peak) -> dict:
    """µs per layer of cuBLAS and of our launch at each split for one op, with the largest difference to the
    unsplit launch's output (bf16: the parts add in another order)."""
    attn = [layer.self_attn for layer in layers]
    modules = {"qkv": attn, "o": [a.o_proj for a in attn], "down": [layer.mlp.down_proj for layer in layers]}[op]
    shape = next(s for s in layer_shapes(config, rows, attn[0].q_proj.bias is not None) if s.name == op)
    engine = linear_tiles.pick_tiles(rows, shape.widths, shape.k, 2, 1, sms)
    x = torch.randn(rows, shape.k, device="cuda", dtype=torch.bfloat16)
    projections = (lambda m: (m.q_proj, m.k_proj, m.v_proj)) if op == "qkv" else (lambda m: (m,))
    lin = torch.nn.functional.linear
    out = {"op": op, "rows": rows, "engine_tiles": vars(engine), "floor_us": shape.floor_us(peak) if peak else None,
           "cublas_us": per_layer_us(lambda m: [lin(x, p.weight, p.bias) for p in projections(m)], modules)}
    reference = _launcher(op, replace(engine, split_k=1))(modules[0], x)
    for split in (1, 2, 3, 4):
        launch = _launcher(op, replace(engine, split_k=split))
        got = launch(modules[0], x)
        out[f"split_{split}"] = {
            "us": per_layer_us(lambda m: launch(m, x), modules),
            "max_abs_diff": float((got.float() - reference.float()).abs().max()),
            "ref_max_abs": float(reference.float().abs().max())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-7b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--ops", nargs="+", default=["qkv", "o", "down"], choices=("qkv", "o", "down"))
    parser.add_argument("--out", type=Path, default=Path("bench/out/split_k_probe.json"))
    args = parser.parse_args()
    model = build_model(args.arch, torch.device("cuda"), torch.bfloat16, False, init_on_device=True).eval()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config, peak = ARCHITECTURES[args.arch], peak_for(torch.cuda.get_device_name())
    with torch.inference_mode():
        results = [probe(list(model.model.layers), config, op, rows, sms, peak)
                   for op in args.ops for rows in args.rows]
    for r in results:
        splits = " ".join(f"{s}: {r[f'split_{s}']['us']:.1f}" for s in (1, 2, 3, 4))
        print(f"rows {r['op']} {r['rows']}: engine split {r['engine_tiles']['split_k']}, cuBLAS {r['cublas_us']:.1f}"
              f" us, ours by split {splits} us, floor {r['floor_us']:.1f}, split 2 diff "
              f"{r['split_2']['max_abs_diff']:.3g} of {r['split_2']['ref_max_abs']:.3g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "arch": args.arch,
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
