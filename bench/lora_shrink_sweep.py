"""The LoRA shrink's split policy swept at a model's real shapes (issue 37 point 3).

The shrink (`lora_shrink`: x @ A^T, narrow output over a long K) is latency-bound at decode sizes: at 1.5B batch 64
its 112 launches a step took 0.81 ms for ~4.6 MB of A a layer, each program looping over up to 17 slices of K
(bench/RESULTS.md, twelfth session). More K splits shorten the loop, but every program of the consumer (the grouped
launch's epilogue, or the expand above 64 rows) then sums more slabs. So each policy is timed as the engine runs a
layer's adapted projections, shrink and consumer together: q/k/v, o, gate/up + SiLU and down, with a peft adapter of
--lora-rank on every linear layer, each op captured in one CUDA graph over the model's layers (bench.kernel_sweep's
`per_layer_us`). A policy is (max splits, MIN_K_PER_SPLIT) of engine/kernels/lora_shrink.py. Each is timed on both
of linear_dispatch's routes for an adapted group, whichever the dispatch rule picks today: the grouped launch with the
adapter in its epilogue (the engine's max splits: EPILOGUE_MAX_SPLITS), and cuBLAS base projections + the shrink +
`lora_expand_` (EXPAND_MAX_SPLITS). With --tiles: the shrink's tiles instead (rows, adapter columns and K step per
program, pipeline stages), at the engine's policy and on the engine's routes. Each variant's output is checked
against the engine's before it is timed.

GPU only (imports on a CPU). That every policy computes the same products is
tests/engine/test_lora_shrink.py's (up to 16 slices, under Triton's interpreter in `make test`).

python -m bench.lora_shrink_sweep --arch qwen2.5-1.5b --rows 64 256 --lora-rank 64
python -m bench.lora_shrink_sweep --arch qwen2.5-1.5b --rows 64 256 --tiles
python -m bench.lora_shrink_sweep --pick bench/out/sweep-*.json   (each route's best variants over several sweeps)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

import torch
from torch import nn

from bench.grpo_step import ARCHITECTURES, build_model
from bench.kernel_sweep import applied, per_layer_us
from tandemrl.engine.kernels import fused_linear, linear_dispatch, lora_shrink
from tandemrl.models.lora import LoraSettings, apply_lora, unwrap_causal_lm

Variant = dict[str, int]  # lora_shrink module attribute -> value for one timing
ROUTES = ("grouped", "cublas")


def policy_variants() -> dict[str, Variant]:
    """(max splits) x (MIN_K_PER_SPLIT), named SPLITSxMINK; both consumers' caps set alike (each route reads one)."""
    return {f"{s}x{k}": {"EPILOGUE_MAX_SPLITS": s, "EXPAND_MAX_SPLITS": s, "MIN_K_PER_SPLIT": k}
            for s, k in itertools.product((1, 2, 4, 8, 16), (256, 512, 1024, 2048))}


def tile_variants() -> dict[str, Variant]:
    """The shrink's tiles (rows, adapter columns, K step per program; pipeline stages) at the engine's policy."""
    return {f"m{m}n{n}k{k}s{st}": {"_BLOCK_M": m, "_BLOCK_N": n, "_BLOCK_K": k, "_STAGES": st}
            for m, n, k, st in itertools.product((16, 32, 64), (16, 32, 64), (64, 128), (2, 3))}


def _relevant(attribute: str, route: str) -> bool:
    """Whether a launch of `route` reads the attribute (the engine's variant matches on these only)."""
    return {"EPILOGUE_MAX_SPLITS": route == "grouped", "EXPAND_MAX_SPLITS": route == "cublas"}.get(attribute, True)


def engine_variant(variants: dict[str, Variant], route: str) -> str | None:
    """The variant equal to lora_shrink's own values where this route reads them."""
    return next((name for name, v in variants.items() if all(
        getattr(lora_shrink, a) == value for a, value in v.items() if _relevant(a, route))), None)


@contextlib.contextmanager
def applied_variant(variant: Variant) -> Iterator[None]:
    """fused_linear and lora_shrink read these at call time: a launch (or a graph capture) inside sees them."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for attribute, value in variant.items():
            stack.enter_context(mock.patch.object(lora_shrink, attribute, value))
        yield


def adapted_model(arch: str, rank: int, device: torch.device, dtype: torch.dtype, layers: int | None) -> nn.Module:
    """Random weights of `arch` (`layers` decoder layers: None, all) with a peft adapter on every linear layer, B
    drawn so the products matter."""
    base = build_model(arch, device, dtype, gradient_checkpointing=False, init_on_device=True, layers=layers)
    model = apply_lora(base, LoraSettings(rank=rank, alpha=2 * rank)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model


def layer_ops(model: nn.Module) -> dict[str, tuple[list[nn.Module], int, Callable]]:
    """op name -> (its module in every layer, its input width, the engine's launcher for it)."""
    layers = unwrap_causal_lm(model).model.layers
    attn, mlps = [layer.self_attn for layer in layers], [layer.mlp for layer in layers]
    projection = fused_linear.lora_projection
    return {
        "qkv": (attn, attn[0].q_proj.in_features, lambda a, x: fused_linear.qkv_projection(a, x)),
        "o": ([a.o_proj for a in attn], attn[0].o_proj.in_features, projection),
        "gate_up": (mlps, mlps[0].gate_proj.in_features, lambda m, x: fused_linear.gate_up_silu(m, x)),
        "down": ([m.down_proj for m in mlps], mlps[0].down_proj.in_features, projection),
    }


@contextlib.contextmanager
def forced_route(route: str) -> Iterator[None]:
    """route "grouped": our grouped launch with the adapter in its epilogue; "cublas": cuBLAS base projections, then
    the shrink and `lora_expand_` (linear_dispatch's two routes for an adapted group), whatever the rule says."""
    with mock.patch.object(linear_dispatch, "grouped_launch_wins", lambda *args: route == "grouped"):
        yield


def engine_route(op: str, rows: int, width: int) -> str:
    return "grouped" if linear_dispatch.grouped_launch_wins("proj" if op in ("o", "down") else op, rows, width,
                                                            True) else "cublas"


def sweep(model: nn.Module, rows_list: list[int], reps: int, variants: dict[str, Variant],
          both_routes: bool) -> list[dict]:
    """µs per layer of each op under each variant (on both routes, or on the engine's), and the best per op. Every
    variant's output of the first layer is checked against the engine's (the same sums in another order)."""
    from triton.runtime.errors import OutOfResources  # GPU only; the module imports without Triton

    results = []
    for rows in rows_list:
        for name, (modules, width, launch) in layer_ops(model).items():
            x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
            ours = engine_route(name, rows, width)
            routes = ROUTES if both_routes else (ours,)
            reference = _output(launch, modules[0], x)
            times: dict[str, dict[str, float]] = {route: {} for route in routes}
            for route, (key, variant) in itertools.product(routes, variants.items()):
                with forced_route(route), applied_variant(variant):
                    try:
                        _check(_output(launch, modules[0], x), reference, f"{name} rows {rows} {route} {key}")
                    except OutOfResources:  # tiles too large for shared memory: not a candidate
                        continue
                    times[route][key] = per_layer_us(lambda m: applied(launch(m, x)), modules, reps)
            engine_key = engine_variant(variants, ours)
            best = min(((r, k) for r in routes for k in times[r]), key=lambda rk: times[rk[0]][rk[1]])
            results.append({"rows": rows, "op": name, "engine_route": ours, "engine_key": engine_key,
                            "engine_us": times[ours].get(engine_key), "best": list(best),
                            "best_us": times[best[0]][best[1]], "us": times})
            print(f"rows {rows} {name}: engine {ours} {engine_key} {times[ours].get(engine_key, float('nan')):.1f} us,"
                  f" best {best} {times[best[0]][best[1]]:.1f} us", flush=True)
    return results


def _output(launch: Callable, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # the adapter's parameters require grad: the launchers decline where autograd would record
        out = applied(launch(module, x))
    return torch.cat([t.reshape(x.shape[0], -1) for t in out], 1) if isinstance(out, tuple) else out.clone()


def _check(out: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    """bf16 outputs of the same products: a wrong tiling differs by the adapter's whole product, not rounding."""
    worst = (out.float() - reference.float()).abs().max().item()
    if worst > 0.05 * max(reference.float().abs().max().item(), 1.0):
        raise RuntimeError(f"{what}: differs from the engine's variant by up to {worst}")


def pick(sweeps: list[Path]) -> None:
    """Per route, the variants with the least time summed over every sweep's ops and rows the engine runs on it."""
    totals: dict[str, dict[str, float]] = {}
    engine: dict[str, set[str]] = {}
    for path in sweeps:
        for row in json.loads(path.read_text())["results"]:
            route = totals.setdefault(row["engine_route"], {})
            engine.setdefault(row["engine_route"], set()).add(row.get("engine_key"))
            for key, us in row["us"][row["engine_route"]].items():
                route[key] = route.get(key, 0.0) + us
    for route, times in totals.items():
        ranked = sorted(times, key=times.get)
        ours = ", ".join(f"{key} {times[key]:.1f}" for key in sorted(engine[route] & set(times)))
        print(f"{route}, summed over {len(sweeps)} sweeps: engine {ours or '-'} us; best "
              + ", ".join(f"{key} {times[key]:.1f}" for key in ranked[:5]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--layers", type=int, default=None, help="decoder layers to build (default: the model's)")
    parser.add_argument("--reps", type=int, default=20, help="graph replays per timing")
    parser.add_argument("--out", type=Path, default=Path("bench/out/lora_shrink_sweep.json"))
    parser.add_argument("--tiles", action="store_true",
                        help="sweep the shrink's tiles at the engine's split policy, on the engine's routes")
    parser.add_argument("--pick", type=Path, nargs="+", help="sweep JSONs: print each route's best variants over them")
    args = parser.parse_args(argv)
    if args.pick:
        pick(args.pick)
        return
    model = adapted_model(args.arch, args.lora_rank, torch.device("cuda"), torch.bfloat16, args.layers)
    variants = tile_variants() if args.tiles else policy_variants()
    results = sweep(model, args.rows, args.reps, variants, both_routes=not args.tiles)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"arch": args.arch, "lora_rank": args.lora_rank,
                                    "device": torch.cuda.get_device_name(),
                                    "variants": variants,
                                    "results": results}, indent=2) + "\n")
    print("| rows | op | engine us | best | best us |")
    for r in results:
        print(f"| {r['rows']} | {r['op']} | {r['engine_us'] or float('nan'):.1f} | {tuple(r['best'])} | "
              f"{r['best_us']:.1f} |")


if __name__ == "__main__":
    main()
