"""One rank of the 2-GPU fused all-reduce tests (tests/engine/test_tp_fused_gpu.py), over NCCL: the kernel against
its reference at several row counts, repeated and inside a CUDA graph replayed with new inputs; then greedy decode of
a small random bf16 Qwen2 model over 2 ranks with the fused all-reduce on and off. Rank 0 writes the results."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.kernels.allreduce_norm import SymmetricAllReduceNorm, allreduce_add_rmsnorm_ref


def _case(reducer: SymmetricAllReduceNorm, x: torch.Tensor, w_local: torch.Tensor, residual: torch.Tensor,
          weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    partial = reducer.partial(x, w_local)
    mine = partial.tensor.clone()  # before the kernel: the next GEMM may overwrite the buffer after it
    out, new_res = partial.add_rmsnorm(residual, weight, 1e-6)
    return mine, out, new_res


def _check(rank: int, world: int, mine, out, new_res, residual, weight) -> dict:
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    ref_out, ref_res = allreduce_add_rmsnorm_ref(parts, residual, weight, 1e-6)
    outs = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(outs, out)
    return {"residual_exact": torch.equal(new_res, ref_res),
            "norm_exact": torch.equal(out, fk.add_rmsnorm(ref_res, None, weight, 1e-6)[0]),
            "norm_close": bool(torch.allclose(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)),
            "ranks_agree": all(torch.equal(o, outs[0]) for o in outs)}


def kernel_checks(rank: int, world: int, device: torch.device) -> dict:
    hidden, inner = 3584, 512
    reducer = SymmetricAllReduceNorm.create(None, 256, hidden, torch.bfloat16, device)
    assert reducer is not None, "no symmetric memory reducer on 2 GPUs"
    g = torch.Generator(device=device).manual_seed(100 + rank)
    weight = torch.rand(hidden, device=device, generator=g).to(torch.bfloat16) + 0.5
    dist.broadcast(weight, 0)
    results = {}
    for rows in (1, 3, 64, 65, 200, 256):
        for rep in range(3):  # buffer and signal pads reused
            x = torch.randn(rows, inner, device=device, generator=g).to(torch.bfloat16)
            w_local = torch.randn(hidden, inner, device=device, generator=g).to(torch.bfloat16) / 20
            residual = torch.randn(rows, hidden, device=device, generator=g).to(torch.bfloat16)
            dist.broadcast(residual, 0)  # the residual stream is the same on every rank
            results[f"eager rows {rows} rep {rep}"] = _check(rank, world, *_case(reducer, x, w_local, residual,
                                                                                    weight), residual, weight)
    results.update(graph_checks(rank, world, device, reducer, weight, g))
    return results


def graph_checks(rank, world, device, reducer, weight, g, rows: int = 64, replays: int = 50) -> dict:
    inner, hidden = 512, reducer.hidden
    x = torch.zeros(rows, inner, device=device, dtype=torch.bfloat16)
    w_local = torch.randn(hidden, inner, device=device, generator=g).to(torch.bfloat16) / 20
    residual = torch.zeros(rows, hidden, device=device, dtype=torch.bfloat16)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        _case(reducer, x, w_local, residual, weight)  # warm-up (compiles) outside the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mine, out, new_res = _case(reducer, x, w_local, residual, weight)
    results = {}
    for i in range(replays):  # fresh inputs each replay: stale reads of a peer's buffer would show
        x.copy_(torch.randn(rows, inner, device=device, generator=g).to(torch.bfloat16))
        fresh = torch.randn(rows, hidden, device=device, generator=g).to(torch.bfloat16)
        dist.broadcast(fresh, 0)
        residual.copy_(fresh)
        graph.replay()
        if i % 10 == 9 or i < 2:
            results[f"graph replay {i}"] = _check(rank, world, mine.clone(), out.clone(), new_res.clone(), residual,
                                                  weight)
    for _ in range(200):  # many back-to-back replays: the barriers stay in step
        graph.replay()
    torch.cuda.synchronize(device)
    results["graph 200 more replays"] = _check(rank, world, mine.clone(), out.clone(), new_res.clone(), residual,
                                               weight)
    return results


def greedy_runs(rank: int, world: int, device: torch.device) -> dict:
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.config import EngineConfig
    from tandemrl.engine.model.tensor_parallel import TensorParallelGroup
    from tests_support.tp_engine_worker import build_model, requests

    model = build_model("qwen2.5-0.5b", "", num_hidden_layers=4, vocab_size=4001).to(device, torch.bfloat16)
    reqs = requests(model.config.vocab_size)
    out = {}
    for label, fused in (("fused", True), ("nccl", False)):
        tp = TensorParallelGroup(rank=rank, size=world, fused_allreduce=fused)
        config = EngineConfig(block_size=16, num_blocks=256, max_num_seqs=8, tensor_parallel_size=world)  # graphs on
        backend = EngineBackend(model, None, config, device=device, tensor_parallel=tp)
        o_proj = backend.engine_model.model.layers[0].self_attn.o_proj
        rollouts = backend.generate(reqs)
        assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
        out[label] = [r.completion_ids for r in rollouts]
        out[f"{label}_reducer"] = o_proj.reducer is not None
        backend.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, out["fused"])
    out["ranks_agree"] = all(g == gathered[0] for g in gathered)
    return out


def run_rank(rank: int, world: int, store_file: str, result_file: str) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", store=dist.FileStore(store_file, world), rank=rank, world_size=world,
                            device_id=device)
    try:
        results = {"kernel": kernel_checks(rank, world, device), "greedy": greedy_runs(rank, world, device)}
        if rank == 0:
            with open(result_file, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()
