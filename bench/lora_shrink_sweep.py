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
`lora_expand_` (EXPAND_MAX_SPLITS).

GPU only (imports on a CPU). That every policy computes the same products is
tests/engine/test_lora_shrink.py's (up to 16 slices, under Triton's interpreter in `make test`).

python -m bench.lora_shrink_sweep --arch qwen2.5-1.5b --rows 64 256 --lora-rank 64
python -m bench.lora_shrink_sweep --pick bench/out/sweep-*.json   (the best policy of each route over several sweeps)
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

Policy = tuple[int, int]  # (max splits, MIN_K_PER_SPLIT)
POLICIES: list[Policy] = list(itertools.product((1, 2, 4, 8, 16), (256, 512, 1024, 2048)))
ROUTES = ("grouped", "cublas")


def engine_policy(route: str) -> Policy:
    splits = lora_shrink.EPILOGUE_MAX_SPLITS if route == "grouped" else lora_shrink.EXPAND_MAX_SPLITS
    return splits, lora_shrink.MIN_K_PER_SPLIT


@contextlib.contextmanager
def shrink_policy(policy: Policy) -> Iterator[None]:
    """fused_linear reads the limits from lora_shrink at call time: a launch (or a graph capture) inside sees them."""
    max_splits, min_k = policy
    with torch.no_grad(), mock.patch.object(lora_shrink, "EPILOGUE_MAX_SPLITS", max_splits), \
            mock.patch.object(lora_shrink, "EXPAND_MAX_SPLITS", max_splits), \
            mock.patch.object(lora_shrink, "MIN_K_PER_SPLIT", min_k):
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


def sweep(model: nn.Module, rows_list: list[int], reps: int) -> list[dict]:
    """µs per layer of each op under each route and policy, and each row count's best per op."""
    results = []
    for rows in rows_list:
        for name, (modules, width, launch) in layer_ops(model).items():
            x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
            times: dict[tuple[str, Policy], float] = {}
            for route, policy in itertools.product(ROUTES, POLICIES):
                with forced_route(route), shrink_policy(policy):
                    times[route, policy] = per_layer_us(lambda m: applied(launch(m, x)), modules, reps)
            route = engine_route(name, rows, width)
            ours = route, engine_policy(route)
            best = min(times, key=times.get)
            results.append({"rows": rows, "op": name, "engine_route": route, "engine_us": times[ours],
                            "best": [best[0], *best[1]], "best_us": times[best],
                            "us": {route: {f"{s}x{k}": times[route, (s, k)] for s, k in POLICIES}
                                   for route in ROUTES}})
            print(f"rows {rows} {name}: engine {ours} {times[ours]:.1f} us, best {best} {times[best]:.1f} us",
                  flush=True)
    return results


def pick(sweeps: list[Path]) -> dict[str, Policy]:
    """Per route, the policy with the least time summed over every sweep's ops and rows that the engine runs on it."""
    totals: dict[str, dict[str, float]] = {}
    for path in sweeps:
        for row in json.loads(path.read_text())["results"]:
            route = totals.setdefault(row["engine_route"], {})
            for key, us in row["us"][row["engine_route"]].items():
                route[key] = route.get(key, 0.0) + us
    best = {}
    for route, times in totals.items():
        ranked = sorted(times, key=times.get)
        ours = "x".join(map(str, engine_policy(route)))
        print(f"{route}, summed over {len(sweeps)} sweeps: engine {ours} {times[ours]:.1f} us; best "
              + ", ".join(f"{key} {times[key]:.1f}" for key in ranked[:5]))
        best[route] = tuple(int(v) for v in ranked[0].split("x"))
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--layers", type=int, default=None, help="decoder layers to build (default: the model's)")
    parser.add_argument("--reps", type=int, default=20, help="graph replays per timing")
    parser.add_argument("--out", type=Path, default=Path("bench/out/lora_shrink_sweep.json"))
    parser.add_argument("--pick", type=Path, nargs="+", help="sweep JSONs: print each route's best policy over them")
    args = parser.parse_args(argv)
    if args.pick:
        pick(args.pick)
        return
    model = adapted_model(args.arch, args.lora_rank, torch.device("cuda"), torch.bfloat16, args.layers)
    results = sweep(model, args.rows, args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"arch": args.arch, "lora_rank": args.lora_rank,
                                    "device": torch.cuda.get_device_name(),
                                    "engine_policy": {r: list(engine_policy(r)) for r in ROUTES},
                                    "results": results}, indent=2) + "\n")
    print("| rows | op | engine policy us | best policy | best us |")
    for r in results:
        print(f"| {r['rows']} | {r['op']} | {r['engine_us']:.1f} | {tuple(r['best'])} | {r['best_us']:.1f} |")


if __name__ == "__main__":
    main()
