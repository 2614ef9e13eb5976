"""Probe: do TMA-fed Triton GEMMs beat the current decode MLP kernels at 128/256 rows (Qwen2.5-0.5B shapes)?

gate/up + SiLU: fused_linear's TMA kernel (tiles fed by the bulk tensor copy engine) over a grid of tiles, beside the
grouped kernel with plain loads (`_gate_up_silu_kernel`, what the GEMV range uses) and cuBLAS, on the module calls and
on one concatenated [2I, H] weight (the GEMM alone) for scale.
down_proj: cuBLAS vs a TMA split-K kernel adding float32 partials atomically (the GEMM part only).
Every variant is checked against a float32 reference before it is timed. GPU only.

python -m bench.tma_probe --rows 256 128
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a CPU install: the bench needs a GPU to run, not to import
    triton = None

from bench.grpo_step import build_model
from bench.kernel_sweep import per_layer_us
from tandemrl.engine.kernels import fused_linear
from tandemrl.engine.kernels.linear_tiles import LinearTiles


if triton is not None:  # prototype kernel; the module imports without Triton (it runs on GPUs only)

    @triton.jit
    def _splitk_tma_kernel(x_desc, w_desc, out_ptr, M, N, K, k_per_split, stride_om,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
        off_n = tl.program_id(0) * BLOCK_N
        off_m = tl.program_id(1) * BLOCK_M
        k_lo = tl.program_id(2) * k_per_split
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(k_lo, tl.minimum(k_lo + k_per_split, K), BLOCK_K, num_stages=STAGES):
            acc = tl.dot(x_desc.load([off_m, k]), w_desc.load([off_n, k]).T, acc)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.atomic_add(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc, mask=mask, sem="relaxed")


def gate_up_tma(mlp, x, bm, bn, bk, warps, stages):
    """fused_linear's TMA gate/up kernel with these tiles."""
    tiles = LinearTiles(bm, bn, bk, num_warps=warps, num_stages=stages)
    return fused_linear.gate_up_silu(mlp, x, tiles=tiles, tma=True)


def gate_up_plain(mlp, x):
    """fused_linear's gate/up kernel with plain loads (its own tiles), as the GEMV range runs it."""
    return fused_linear.gate_up_silu(mlp, x, tma=False)


def down_splitk(mlp, act, out, bm, bn, bk, splits, warps, stages):
    M, K = act.shape
    w = mlp.down_proj.weight
    N = w.shape[0]
    per = triton.cdiv(triton.cdiv(K, splits), bk) * bk
    out.zero_()
    _splitk_tma_kernel[(triton.cdiv(N, bn), triton.cdiv(M, bm), triton.cdiv(K, per))](
        TensorDescriptor.from_tensor(act, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]), out,
        M, N, K, per, out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, num_warps=warps)
    return out


def rel_err(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def probe(layers, rows: int, with_down: bool) -> dict:
    mlps = [layer.mlp for layer in layers]
    x = torch.randn(rows, 896, device="cuda", dtype=torch.bfloat16)
    act = torch.randn(rows, 4864, device="cuda", dtype=torch.bfloat16)
    m0 = mlps[0]
    x32 = x.float()
    ref_gu = torch.nn.functional.silu(x32 @ m0.gate_proj.weight.float().T) * (x32 @ m0.up_proj.weight.float().T)
    ref_down = act.float() @ m0.down_proj.weight.float().T
    cat = [torch.cat((m.gate_proj.weight, m.up_proj.weight)) for m in mlps]
    row: dict = {
        "grouped_gate_up": per_layer_us(lambda m: gate_up_plain(m, x), mlps),
        "cublas_gate_up_silu": per_layer_us(lambda m: torch.nn.functional.silu(m.gate_proj(x)) * m.up_proj(x), mlps),
        "cublas_cat_gemm": per_layer_us(lambda i: x @ cat[i].T, list(range(len(mlps)))),
        "cublas_down": per_layer_us(lambda m: m.down_proj(act), mlps),
    }
    best = []
    for bm, bn, bk, warps, stages in itertools.product((64, 128), (32, 64, 128), (64, 128), (4, 8), (3, 4)):
        if bm > max(64, rows) or (bm + 2 * bn) * bk * 2 * stages > 220 * 1024:
            continue
        try:
            err = rel_err(gate_up_tma(m0, x, bm, bn, bk, warps, stages), ref_gu)
            assert err < 1e-2, f"gate/up {bm, bn, bk}: rel. error {err}"
            best.append((per_layer_us(lambda m: gate_up_tma(m, x, bm, bn, bk, warps, stages), mlps),
                         (bm, bn, bk, warps, stages)))
        except Exception as exc:
            print(f"  gate/up tma {bm, bn, bk, warps, stages}: {type(exc).__name__}: {str(exc)[:120]}")
    best.sort()
    row["tma_gate_up_top"] = best[:5]
    if not with_down:
        return row
    down = []
    out = torch.empty(rows, 896, device="cuda", dtype=torch.float32)
    for bm, bn, bk, splits, stages in itertools.product((64, 128, 256), (32, 64), (64, 128), (4, 8), (3, 4)):
        warps = 4 if bm * bn <= 8192 else 8
        if bm > max(64, rows) or (bm + bn) * bk * 2 * stages > 220 * 1024:
            continue
        try:
            err = rel_err(down_splitk(m0, act, out, bm, bn, bk, splits, warps, stages), ref_down)
            assert err < 1e-2, f"down {bm, bn, bk, splits}: rel. error {err}"
            down.append((per_layer_us(lambda m: down_splitk(m, act, out, bm, bn, bk, splits, warps, stages), mlps),
                         (bm, bn, bk, splits, warps, stages)))
        except Exception as exc:
            print(f"  down tma {bm, bn, bk, splits, warps, stages}: {type(exc).__name__}: {str(exc)[:120]}")
    down.sort()
    row["tma_splitk_down_top"] = down[:5]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[256])
    parser.add_argument("--skip-down", action="store_true", help="gate/up only")
    parser.add_argument("--out", type=Path, default=Path("bench/results/tma_probe.json"))
    args = parser.parse_args()
    model = build_model("qwen2.5-0.5b", torch.device("cuda"), torch.bfloat16, False)
    layers = list(model.model.layers)
    results = {}
    with torch.inference_mode():
        for rows in args.rows:
            results[rows] = probe(layers, rows, not args.skip_down)
            print(rows, json.dumps(results[rows], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
