"""Would o_proj's and down_proj's LoRA shrink cost less on a side stream, beside the cuBLAS GEMM (issue 37 point 3)?

The engine runs an adapted o_proj / down_proj as cuBLAS base GEMM, then the shrink (x @ A^T), then the expand
(fused_linear._cublas_with_lora), one after another. The shrink reads the same input as the GEMM and only the
expand needs both, so the shrink could run on a second stream while the GEMM runs (a fork and a join in the same
CUDA graph). This times both orders per layer, as bench.lora_shrink_sweep times an op (one graph over the model's
layers, bench.kernel_sweep.per_layer_us), with a peft adapter of --lora-rank on every linear layer, and checks the
side-stream output equals the engine's bit for bit (the same kernels on the same operands).

GPU only: python -m bench.lora_side_stream --arch qwen2.5-1.5b qwen2.5-7b --rows 64 256
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn import functional as F

from bench.kernel_sweep import applied, per_layer_us
from bench.lora_shrink_sweep import adapted_model, layer_ops
from tandemrl.engine.kernels import fused_linear, lora_shrink
from tandemrl.engine.kernels.linear_dispatch import route_group
from tandemrl.engine.kernels.lora_expand import lora_expand_


def shrink_beside_gemm(module: torch.nn.Module, x: torch.Tensor, side: torch.cuda.Stream) -> torch.Tensor:
    """fused_linear._cublas_with_lora for one adapted module, the shrink forked onto ``side`` before the GEMM and
    joined before the expand."""
    group = route_group("proj", [module], x, None)
    if group is None:
        raise RuntimeError("the engine's LoRA route does not apply to this input")
    (base, parts), = group.operands
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        xa = lora_shrink.lora_shrink(x, [parts.a], fused_linear._sm_count(x.device), lora_shrink.EXPAND_MAX_SPLITS)
    out = F.linear(x, base.weight, base.bias)
    main.wait_stream(side)
    if not torch.cuda.is_current_stream_capturing():
        xa.record_stream(main)  # made on the side stream, read on this one
    lora_expand_([out], xa, [parts.b], [parts.scaling], fused_linear._sm_count(x.device))
    return out


def compare(arch: str, rows_list: list[int], rank: int, reps: int) -> list[dict]:
    model = adapted_model(arch, rank, torch.device("cuda"), torch.bfloat16, None)
    side = torch.cuda.Stream()
    rows_out = []
    with torch.no_grad():
        for rows in rows_list:
            for name in ("o", "down"):
                modules, width, launch = layer_ops(model)[name]
                x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
                engine = applied(launch(modules[0], x)).clone()
                beside = shrink_beside_gemm(modules[0], x, side).clone()
                torch.cuda.synchronize()
                row = {"arch": arch, "rows": rows, "op": name, "equal": bool(torch.equal(engine, beside)),
                       "engine_us": per_layer_us(lambda m: applied(launch(m, x)), modules, reps),
                       "beside_us": per_layer_us(lambda m: shrink_beside_gemm(m, x, side), modules, reps)}
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    del model
    torch.cuda.empty_cache()
    return rows_out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=["qwen2.5-1.5b"])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench/out/lora_side_stream.json"))
    args = parser.parse_args(argv)
    results = [row for arch in args.arch for row in compare(arch, args.rows, args.lora_rank, args.reps)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        print(f"{r['arch']} rows {r['rows']} {r['op']}: engine {r['engine_us']:.1f} us, shrink beside the GEMM "
              f"{r['beside_us']:.1f} us per layer ({r['beside_us'] / r['engine_us']:.2f}x), equal {r['equal']}")


if __name__ == "__main__":
    main()
