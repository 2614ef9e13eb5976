"""Tile sweep of the decode kernels at their real shapes (Qwen2.5-0.5B, all 24 layers so weights stream from
HBM as in a step): each op captured in one CUDA graph over the 24 layers, timed per layer with events, beside
cuBLAS (the module calls) at the same shape. GPU only; prints a table and writes JSON.

python -m bench.kernel_sweep --rows 64 128 256
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.grpo_step import build_model
from tandemrl.engine import fused_linear, triton_attention
from tandemrl.engine.fused_linear import LinearTiles


def per_layer_us(op, layers, reps: int = 20) -> float:
    """Microseconds of op(layer) averaged over a graph replaying it for every layer, `reps` times."""
    for layer in layers:
        op(layer)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            op(layer)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(layers))


def tile_grid(rows: int) -> list[LinearTiles]:
    grid = []
    for bm, bn, bk, warps, stages in itertools.product(
            (16, 32, 64, 128, 256), (16, 32, 64, 128), (64, 128), (4, 8), (2, 3, 4)):
        if bm > max(16, rows) or bm * bn > 128 * 64 or (bm + bn) * bk * stages * 2 > 200 * 1024:
            continue
        grid.append(LinearTiles(bm, bn, bk, warps, stages))
    return grid


def sweep_linear(layers, rows_list: list[int]) -> dict:
    results = {}
    original = fused_linear.pick_tiles
    for rows in rows_list:
        x = torch.randn(rows, 896, device="cuda", dtype=torch.bfloat16)
        act = torch.randn(rows, 4864, device="cuda", dtype=torch.bfloat16)
        attn = [layer.self_attn for layer in layers]
        mlps = [layer.mlp for layer in layers]
        row = {
            "cublas_qkv": per_layer_us(lambda a: (a.q_proj(x), a.k_proj(x), a.v_proj(x)), attn),
            "cublas_o": per_layer_us(lambda a: a.o_proj(x), attn),
            "cublas_gate_up_silu": per_layer_us(
                lambda m: torch.nn.functional.silu(m.gate_proj(x)) * m.up_proj(x), mlps),
            "cublas_down": per_layer_us(lambda m: m.down_proj(act), mlps),
        }
        for name, op, mods in (("qkv", lambda a: fused_linear.qkv_projection(a, x, max_rows=1 << 20), attn),
                               ("gate_up", lambda m: fused_linear.gate_up_silu(m, x, max_rows=1 << 20), mlps)):
            timed = []
            for tiles in tile_grid(rows):
                fused_linear.pick_tiles = lambda *args, _t=tiles, **kw: _t
                try:
                    timed.append((per_layer_us(op, mods), vars(tiles)))
                except Exception as exc:  # out of shared memory / registers: skip the config
                    print(f"  {name} {tiles}: {type(exc).__name__}")
            fused_linear.pick_tiles = original
            timed.sort(key=lambda t: t[0])
            row[f"triton_{name}"] = timed[0][0]
            row[f"triton_{name}_tiles"] = timed[0][1]
            row[f"triton_{name}_top5"] = timed[:5]
            row[f"triton_{name}_default"] = per_layer_us(op, mods)
        results[rows] = row
        print(f"rows {rows}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in row.items()), flush=True)
    return results


@triton.jit
def _split_k_kernel(x_ptr, w_ptr, part_ptr, M, N, K, CHUNK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    # Prototype: partial sums of x[M, K] @ w[N, K]^T over one K chunk per program, float32 [splits, M, N].
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(2)
    offs_k = tl.arange(0, BLOCK_K)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        k_ok = (k0 + offs_k) < hi
        x = tl.load(x_ptr + offs_m[:, None] * K + (k0 + offs_k)[None, :], mask=(offs_m[:, None] < M) & k_ok[None, :],
                    other=0.0)
        w = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * K + (k0 + offs_k)[:, None],
                    mask=(offs_n[None, :] < N) & k_ok[:, None], other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(part_ptr + (split * M + offs_m[:, None]) * N + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def sweep_split_k(layers, rows_list: list[int]) -> dict:
    """The down projection ([rows, 4864] @ [4864, 896]) as split-K partials, kernel alone, best config."""
    results = {}
    for rows in rows_list:
        act = torch.randn(rows, 4864, device="cuda", dtype=torch.bfloat16)
        downs = [layer.mlp.down_proj.weight for layer in layers]
        row = {}
        for bm, bn, bk, splits, warps, stages in itertools.product(
                (32, 64, 128), (32, 64, 128), (64, 128), (1, 2, 4, 8), (4,), (3, 4)):
            if bm > max(16, rows) or bm * bn > 128 * 64:
                continue
            part = torch.empty(splits, rows, 896, device="cuda", dtype=torch.float32)
            chunk = -(-(-(-4864 // splits)) // bk) * bk
            grid = (-(-896 // bn), -(-rows // bm), splits)
            try:
                us = per_layer_us(lambda w: _split_k_kernel[grid](act, w, part, rows, 896, 4864, chunk, BLOCK_M=bm,
                                                                  BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                                                  num_stages=stages), downs)
            except Exception as exc:
                print(f"  split-k {bm}/{bn}/{bk}/{splits}/{warps}/{stages}: {type(exc).__name__}")
                continue
            row[f"{bm}/{bn}/{bk}/{splits}/{warps}/{stages}"] = us
        best = sorted((v, k) for k, v in row.items())[:5]
        print(f"split-k down rows {rows}: best {best}", flush=True)
        results[rows] = row
    return results


def sweep_attention(batches: list[int], context: int = 384) -> dict:
    results = {}
    block, kv_heads, head_dim, heads, layers = 16, 2, 64, 14, 24
    knobs = ("_DECODE_BLOCK_N", "_DECODE_WARPS", "_DECODE_STAGES")
    original = {k: getattr(triton_attention, k) for k in knobs}
    for batch in batches:
        width = -(-context // block)
        caches = [torch.randn(batch * width, block, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2 * layers)]
        tables = torch.arange(batch * width, device="cuda").view(batch, width)
        ctx = torch.full((batch,), context, device="cuda")
        q = torch.randn(batch, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        row = {}
        for bn, warps, stages, splits in itertools.product((32, 64, 128), (2, 4), (2, 3, 4), (1, 2, 4)):
            for knob, value in zip(knobs, (bn, warps, stages)):
                setattr(triton_attention, knob, value)
            try:
                us = per_layer_us(lambda i: triton_attention.triton_paged_decode(
                    q, caches[2 * i], caches[2 * i + 1], tables, ctx, 0.125, None, num_splits=splits), range(layers))
            except Exception as exc:
                print(f"  attention {bn}/{warps}/{stages}/{splits}: {type(exc).__name__}")
                continue
            row[f"{bn}/{warps}/{stages}/{splits}"] = us
        for knob, value in original.items():
            setattr(triton_attention, knob, value)
        row["default"] = per_layer_us(lambda i: triton_attention.triton_paged_decode(
            q, caches[2 * i], caches[2 * i + 1], tables, ctx, 0.125, None), range(layers))
        kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
        best = min((v, k) for k, v in row.items())
        print(f"attention batch {batch}: default {row['default']:.2f} us, best {best[1]} {best[0]:.2f} us "
              f"(KV {kv_bytes / 1e6:.1f} MB per layer)", flush=True)
        results[batch] = row
        del caches
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--attention-batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--parts", nargs="+", choices=("linear", "split_k", "attention"),
                        default=["linear", "split_k", "attention"])
    parser.add_argument("--out", type=Path, default=Path("bench/out/kernel_sweep.json"))
    args = parser.parse_args()
    model = build_model("qwen2.5-0.5b", torch.device("cuda"), torch.bfloat16, False).eval()
    layers = list(model.model.layers)
    parts = {"linear": lambda: sweep_linear(layers, args.rows), "split_k": lambda: sweep_split_k(layers, args.rows),
             "attention": lambda: sweep_attention(args.attention_batches)}
    with torch.inference_mode():
        result = {"device": torch.cuda.get_device_name(), **{name: parts[name]() for name in args.parts}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
