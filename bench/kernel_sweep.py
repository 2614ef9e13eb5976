"""Tile sweep of the decode kernels at their real shapes (all layers of a random-weight model of `--arch`, so
weights stream from HBM as in a step): each op captured in one CUDA graph over the layers, timed per layer with
events, beside cuBLAS at the same shape. GPU only (imports on a CPU); prints a table and writes JSON.

Part `linear` (issue 37 point 2): every linear op of a layer (q/k/v, o, gate/up + SiLU, down; the lm head is
cuBLAS's in the engine, not timed) at each row count three ways: cuBLAS (F.linear on the same bf16 weights), our
grouped kernel with the tiles the engine picks, and the best of a tile sweep (`linear_grid`), each as µs per layer,
TB/s of weight bytes, TFLOP/s and the multiple of the roofline floor (bench.linear_roofline), with the winner and
the proposed dispatch; a markdown table beside the JSON (same name, .md). Our kernel is timed where the engine
does not use it (o/down; above 64 rows the reductions beyond linear_dispatch._MAX_K_ABOVE_GEMV) too: the
question.
`--compile-only --shard i/n` runs each variant once untimed so that n such processes in parallel fill Triton's
disk cache before the timed run (bench/gpu_linear_ab.sh).

python -m bench.kernel_sweep --arch qwen2.5-7b --rows 1 64 256 --parts linear
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install: the bench needs a GPU to run, not to import
    triton = None

from bench.grpo_step import ARCHITECTURES, build_model
from bench.linear_roofline import ELEMENT_BYTES, LinearShape, ab_entry, layer_shapes, markdown_table, peak_for
from tandemrl.engine.kernels import fused_linear, linear_dispatch, linear_tiles, triton_attention
from tandemrl.engine.kernels.attention_tiles import DecodeAttentionTiles
from tandemrl.engine.kernels.linear_tiles import LinearTiles


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


def decode_tiles(block_n: int, warps: int, stages: int) -> DecodeAttentionTiles:
    """Attention tiles with these values for both kernel variants, so whichever one the split count picks runs them."""
    return DecodeAttentionTiles(block_n=block_n, stages=stages, single_pass_block_n=block_n,
                                single_pass_stages=stages, num_warps=warps)


@dataclass(frozen=True)
class Variant:
    """One way to run our kernel for an op: tiles None are the engine's own (`pick_tiles`, the TMA table); tma
    says which gate/up kernel runs the given tiles (the others have one kernel)."""

    tiles: LinearTiles | None = None
    tma: bool = False

    def label(self) -> dict | None:
        return None if self.tiles is None else {**vars(self.tiles), "tma": self.tma}


@dataclass(frozen=True)
class LinearOp:
    """A layer's linear op, timed over `modules` (one per layer): cuBLAS's calls (F.linear on the module's bf16
    weights, the engine's path today for o/down, and for q/k/v, gate/up where our kernel does not apply) and ours."""

    shape: LinearShape
    modules: list
    cublas: Callable
    ours: Callable  # (module, x, variant) -> output


OP_NAMES = ("qkv", "o", "gate_up", "down")


def linear_grid(rows: int, op: str) -> list[Variant]:
    """The tiles swept per op. Up to 64 rows (a GEMV) one row tile as `pick_tiles` keeps, and the column tile sets
    the number of programs (wave quantisation); above, the GEMM tiles near `_LARGE_BATCH_TILES`, gate/up with both
    kernels. Over ~200 KB of pipelined tiles or 8192 accumulators per program is left out (spills)."""
    per = 2 if op == "gate_up" else 1
    if rows <= 64:
        block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
        block_ns = (8, 16, 32, 64, 128) if block_m <= 32 else (16, 32, 64, 128)  # pick_tiles' floor: block_m / 4
        shapes = itertools.product((block_m,), block_ns, (64, 128), (None,), (3, 4))
    else:
        shapes = itertools.product((64, 128), (32, 64, 128), (64,), (4, 8), (3, 4))
    grid = []
    for bm, bn, bk, warps, stages in shapes:
        if bm * bn > 128 * 64 or (bm + per * bn) * bk * stages * 2 > 200 * 1024:
            continue
        tiles = LinearTiles(bm, bn, bk, warps or (4 if bm * bn * per <= 4096 else 8), stages)
        grid.append(Variant(tiles))
        if op == "gate_up" and rows > 64 and tiles.num_warps == 4:
            grid.append(Variant(tiles, tma=True))
    return grid


def _ours_single(module, x, variant: Variant):
    """o/down through the grouped kernel with one weight (the launch lora_projection makes for an adapted module;
    a plain nn.Linear is cuBLAS's in the engine): the kernel the engine would run if it took them."""
    out = torch.empty(x.shape[0], module.weight.shape[0], device=x.device, dtype=x.dtype)
    fused_linear._grouped_linear(x, [module.weight], [module.bias], out, variant.tiles, [None])
    return out


def _ours_everywhere():
    """Our launchers at every K above 64 rows too (the engine's dispatch sends long reductions to cuBLAS there)."""
    limits = linear_dispatch._MAX_K_ABOVE_GEMV
    return mock.patch.dict(limits, dict.fromkeys(limits, 1 << 30))


def applied(result):
    if result is None:  # the launcher declined: timing cuBLAS under our name would be a lie
        raise RuntimeError("our launcher does not apply to this input")
    return result


def linear_ops(layers, config: dict, rows: int) -> dict[str, LinearOp]:
    attn = [layer.self_attn for layer in layers]
    mlps = [layer.mlp for layer in layers]
    shapes = {s.name: s for s in layer_shapes(config, rows, attn[0].q_proj.bias is not None)}
    lin = torch.nn.functional.linear
    big = 1 << 20  # no row limit: the engine's max_rows is a dispatch choice, the one this bench informs
    return {
        "qkv": LinearOp(shapes["qkv"], attn,
                        lambda a, x: tuple(lin(x, p.weight, p.bias) for p in (a.q_proj, a.k_proj, a.v_proj)),
                        lambda a, x, v: applied(fused_linear.qkv_projection(a, x, max_rows=big, tiles=v.tiles))),
        "o": LinearOp(shapes["o"], [a.o_proj for a in attn], lambda p, x: lin(x, p.weight, p.bias), _ours_single),
        "gate_up": LinearOp(shapes["gate_up"], mlps,
                            lambda m, x: torch.nn.functional.silu(lin(x, m.gate_proj.weight, m.gate_proj.bias))
                            * lin(x, m.up_proj.weight, m.up_proj.bias),
                            lambda m, x, v: applied(fused_linear.gate_up_silu(
                                m, x, max_rows=big, tiles=v.tiles, tma=None if v.tiles is None else v.tma))),
        "down": LinearOp(shapes["down"], [m.down_proj for m in mlps], lambda p, x: lin(x, p.weight, p.bias),
                         _ours_single),
    }


def engine_tiles(shape: LinearShape, sms: int) -> dict:
    """The tiles the engine's launchers pick for this shape (the `tiles=None` call), for the record."""
    if shape.name == "gate_up" and shape.rows > linear_tiles.GEMV_ROWS:
        tiles, tma = linear_tiles.tma_gate_up_tiles(shape.rows, ELEMENT_BYTES), True
    else:
        widths, per = ((shape.widths[0],), 2) if shape.name == "gate_up" else (shape.widths, 1)
        tiles, tma = linear_tiles.pick_tiles(shape.rows, widths, shape.k, ELEMENT_BYTES, per, sms), False
    return Variant(tiles, tma).label()


def _time(op: LinearOp, x, variant: Variant | None, reps: int) -> float | None:
    """µs per layer of cuBLAS (variant None) or ours; None where our kernel cannot run these tiles."""
    try:
        if variant is None:
            return per_layer_us(lambda mod: op.cublas(mod, x), op.modules, reps)
        return per_layer_us(lambda mod: op.ours(mod, x, variant), op.modules, reps)
    except Exception as exc:  # out of shared memory / registers: skip the config
        print(f"  {op.shape.name} rows {op.shape.rows} {variant}: {type(exc).__name__}: {exc}"[:300])
        return None


@dataclass
class OpResult:
    cublas_us: float | None = None
    default_us: float | None = None
    sweep: list = field(default_factory=list)  # (us, tiles label) of each config that ran
    grid_size: int = 0
    swept: int = 0


def sweep_linear_ab(layers, config: dict, rows_list: list[int], budget_s: float, reps: int,
                    save: Callable[[dict], None]) -> dict:
    """cuBLAS and our kernel with the engine's tiles at every (rows, op) first, then the tile sweeps until
    `budget_s` runs out (later sweeps cut short, counted in the output); `save` gets the results so far after
    each op's sweep."""
    started = time.monotonic()
    ops = {rows: linear_ops(layers, config, rows) for rows in rows_list}
    inputs = {(rows, name): torch.randn(rows, op.shape.k, device="cuda", dtype=torch.bfloat16)
              for rows in rows_list for name, op in ops[rows].items()}
    results = {(rows, name): OpResult() for rows in rows_list for name in OP_NAMES}
    with _ours_everywhere():
        for (rows, name), res in results.items():
            op, x = ops[rows][name], inputs[rows, name]
            res.cublas_us, res.default_us = _time(op, x, None, reps), _time(op, x, Variant(), reps)
            print(f"{name} rows {rows}: cuBLAS {res.cublas_us} us, ours (engine tiles) {res.default_us} us",
                  flush=True)
        save(results)
        for (rows, name), res in results.items():
            grid = linear_grid(rows, name)
            res.grid_size = len(grid)
            for variant in grid:
                if time.monotonic() - started > budget_s:
                    break
                us = _time(ops[rows][name], inputs[rows, name], variant, reps)
                res.swept += 1
                if us is not None:
                    res.sweep.append((us, variant.label()))
            res.sweep.sort(key=lambda t: t[0])
            best = f"{res.sweep[0][0]:.2f} us {res.sweep[0][1]}" if res.sweep else "-"
            print(f"{name} rows {rows}: swept {res.swept}/{res.grid_size}, best {best}", flush=True)
            save(results)
    return results


def ab_report(results: dict, config: dict, layers, device_name: str, sms: int) -> dict:
    """The A/B entries (bench.linear_roofline.ab_entry) and the proposed dispatch per op and rows."""
    peak = peak_for(device_name)
    qkv_bias = layers[0].self_attn.q_proj.bias is not None
    entries = []
    for (rows, name), res in results.items():
        if res.cublas_us is None:
            continue
        shape = next(s for s in layer_shapes(config, rows, qkv_bias) if s.name == name)
        best_us, best_tiles = res.sweep[0] if res.sweep else (None, None)
        entry = ab_entry(shape, peak, res.cublas_us, res.default_us, best_us, best_tiles, engine_tiles(shape, sms))
        entries.append({**entry, "swept": res.swept, "grid_size": res.grid_size, "top5": res.sweep[:5]})
    entries.sort(key=lambda e: (OP_NAMES.index(e["op"]), e["rows"]))
    dispatch = {}
    for e in entries:
        dispatch.setdefault(e["op"], {})[e["rows"]] = e["proposed"]
    return {"peak": vars(peak) if peak else None, "ab": entries, "dispatch": dispatch,
            "table": markdown_table(entries)}


def compile_only(layers, config: dict, rows_list: list[int], shard: int, shards: int) -> None:
    """Run every variant of this shard once (no timing): Triton's on-disk cache then holds its compiled kernel, so
    a timed run in another process after several such shards in parallel spends its budget timing, not compiling."""
    plan = [(rows, name, variant) for rows in rows_list for name in OP_NAMES
            for variant in [Variant(), *linear_grid(rows, name)]]
    with _ours_everywhere():
        for rows, name, variant in plan[shard::shards]:
            op = linear_ops(layers, config, rows)[name]
            x = torch.randn(rows, op.shape.k, device="cuda", dtype=torch.bfloat16)
            try:
                op.ours(op.modules[0], x, variant)
            except Exception as exc:
                print(f"  {name} rows {rows} {variant}: {type(exc).__name__}"[:200])
    torch.cuda.synchronize()
    print(f"shard {shard}/{shards}: {len(plan[shard::shards])} variants compiled", flush=True)


if triton is not None:  # prototype kernel; the module imports without Triton (it runs on GPUs only)

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
            x = tl.load(x_ptr + offs_m[:, None] * K + (k0 + offs_k)[None, :],
                        mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * K + (k0 + offs_k)[:, None],
                        mask=(offs_n[None, :] < N) & k_ok[:, None], other=0.0)
            acc = tl.dot(x, w, acc)
        tl.store(part_ptr + (split * M + offs_m[:, None]) * N + offs_n[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def sweep_split_k(layers, rows_list: list[int]) -> dict:
    """The down projection ([rows, inter] @ [inter, hidden]) as split-K partials, kernel alone, best config."""
    results = {}
    for rows in rows_list:
        downs = [layer.mlp.down_proj.weight for layer in layers]
        n, k = downs[0].shape
        act = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        row = {}
        for bm, bn, bk, splits, warps, stages in itertools.product(
                (32, 64, 128), (32, 64, 128), (64, 128), (1, 2, 4, 8), (4,), (3, 4)):
            if bm > max(16, rows) or bm * bn > 128 * 64:
                continue
            part = torch.empty(splits, rows, n, device="cuda", dtype=torch.float32)
            chunk = -(-(-(-k // splits)) // bk) * bk
            grid = (-(-n // bn), -(-rows // bm), splits)
            try:
                us = per_layer_us(lambda w: _split_k_kernel[grid](act, w, part, rows, n, k, chunk, BLOCK_M=bm,
                                                                  BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                                                  num_stages=stages), downs)
            except Exception as exc:
                print(f"  split-k {bm}/{bn}/{bk}/{splits}/{warps}/{stages}: {type(exc).__name__}")
                continue
            row[f"{bm}/{bn}/{bk}/{splits}/{warps}/{stages}"] = us
        best = sorted((us, key) for key, us in row.items())[:5]
        print(f"split-k down rows {rows}: best {best}", flush=True)
        results[rows] = row
    return results


def sweep_attention(batches: list[int], context: int = 384) -> dict:
    """The paged decode attention at Qwen2.5-0.5B's heads (whatever --arch), context 384."""
    results = {}
    block, kv_heads, head_dim, heads, layers = 16, 2, 64, 14, 24
    for batch in batches:
        width = -(-context // block)
        caches = [torch.randn(batch * width, block, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2 * layers)]
        tables = torch.arange(batch * width, device="cuda").view(batch, width)
        ctx = torch.full((batch,), context, device="cuda")
        q = torch.randn(batch, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        row = {}
        for bn, warps, stages, splits in itertools.product((32, 64, 128), (2, 4), (2, 3, 4), (1, 2, 4)):
            tiles = decode_tiles(bn, warps, stages)
            try:
                us = per_layer_us(lambda i: triton_attention.triton_paged_decode(
                    q, caches[2 * i], caches[2 * i + 1], tables, ctx, 0.125, None, num_splits=splits, tiles=tiles),
                    range(layers))
            except Exception as exc:
                print(f"  attention {bn}/{warps}/{stages}/{splits}: {type(exc).__name__}")
                continue
            row[f"{bn}/{warps}/{stages}/{splits}"] = us
        row["default"] = per_layer_us(lambda i: triton_attention.triton_paged_decode(
            q, caches[2 * i], caches[2 * i + 1], tables, ctx, 0.125, None), range(layers))
        kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
        best = min((v, k) for k, v in row.items())
        print(f"attention batch {batch}: default {row['default']:.2f} us, best {best[1]} {best[0]:.2f} us "
              f"(KV {kv_bytes / 1e6:.1f} MB per layer)", flush=True)
        results[batch] = row
        del caches
    return results


def run_linear(layers, args, result: dict) -> dict:
    """The linear A/B (or, with --compile-only, one shard of its compiles); the JSON and table saved as it goes."""
    config = ARCHITECTURES[args.arch]
    if args.compile_only:
        shard, shards = (int(v) for v in args.shard.split("/"))
        compile_only(layers, config, args.rows, shard, shards)
        return {}
    device = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def save(results: dict) -> None:
        report = ab_report(results, config, layers, device, sms)
        _write(args.out, {**result, "linear": report})
        args.out.with_suffix(".md").write_text(f"{_heading(args, device, len(layers))}\n\n{report['table']}\n")

    results = sweep_linear_ab(layers, config, args.rows, args.budget_s, args.reps, save)
    report = ab_report(results, config, layers, device, sms)
    print(_heading(args, device, len(layers)), report["table"], sep="\n\n", flush=True)
    return report


def _heading(args, device: str, layers: int) -> str:
    full = ARCHITECTURES[args.arch]["num_hidden_layers"]
    of = "all" if layers == full else f"{layers} of {full} (fewer than the model's)"
    return f"{args.arch} on {device}, {of} layers, µs per layer (CUDA graph over the layers, {args.reps} replays)"


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers to build (default: the model's)")
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--attention-batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--parts", nargs="+", choices=("linear", "split_k", "attention"),
                        default=["linear", "split_k", "attention"])
    parser.add_argument("--budget-s", type=float, default=600.0, help="linear: stop the tile sweeps after this")
    parser.add_argument("--reps", type=int, default=10, help="linear: graph replays per timing")
    parser.add_argument("--compile-only", action="store_true", help="linear: compile one shard's variants, untimed")
    parser.add_argument("--shard", default="0/1", help="with --compile-only: i/n, this process's share")
    parser.add_argument("--out", type=Path, default=Path("bench/out/kernel_sweep.json"))
    args = parser.parse_args()
    if args.compile_only and args.parts != ["linear"]:
        parser.error("--compile-only compiles the linear part's kernels: pass --parts linear")
    model = build_model(args.arch, torch.device("cuda"), torch.bfloat16, False, init_on_device=True,
                        layers=args.layers).eval()
    layers = list(model.model.layers)
    result = {"device": torch.cuda.get_device_name(), "arch": args.arch, "layers": len(layers),
              "model_layers": ARCHITECTURES[args.arch]["num_hidden_layers"], "rows": args.rows}
    parts = {"linear": lambda: run_linear(layers, args, result),
             "split_k": lambda: sweep_split_k(layers, args.rows),
             "attention": lambda: sweep_attention(args.attention_batches)}
    with torch.inference_mode():
        for name in args.parts:
            result[name] = parts[name]()
    if not args.compile_only:
        _write(args.out, result)


if __name__ == "__main__":
    main()
