"""Tensor-parallel decode: one engine over N ranks (engine.tensor_parallel_size = N) against one engine per GPU, in one
torchrun launch: the decode step time at each (batch, prompt + new tokens) shape, and greedy parity.

Every rank builds the same random-weight model (one seed) on its GPU. Rank 0 first runs the whole model alone (the
other ranks wait), then all ranks run the tensor-parallel engine over the same model's shards. A shape's decode step time is (time of prompt + new tokens - time of the prompt and one token) / (new - 1),
after a short warm-up at that batch (graphs captured, kernels compiled). Sampling is seeded (temperature 1, EOS
ignored: fixed lengths).

Greedy parity (bf16): the tokens of both engines on --parity-prompts prompts. The shard sums o_proj / down_proj
over ranks in another order than one GPU does, so bf16 rounding may flip an argmax where the top two logits nearly
tie; after that the continuations differ. How large that rounding is gets measured, teacher-forced: the whole model
and the tensor-parallel shard (Hugging Face forwards) both read each
prompt + the whole engine's greedy tokens, and at every position the largest |logit difference| over the vocabulary
is that position's noise. A first difference counts as a rounding tie when the whole model's logit gap there
between the two engines' tokens (the top-2 gap when the shard's token is the runner-up) is within that position's
noise; a wider gap is a real mismatch.

--profile DIR: instead of the timings and parity, a torch.profiler breakdown of one decode step per (batch, prompt)
of --shapes (bench/tp_profile.py), both engines; its JSON and gzipped traces in DIR.

GPU (2 GPUs): torchrun --nproc-per-node 2 -m bench.tp_decode --arch qwen2.5-7b
CPU (gloo):   torchrun --nproc-per-node 2 -m bench.tp_decode --cpu-smoke [--profile /tmp/tp_profile]
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

import torch

from bench.engine_throughput import random_prompts, timed
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.types import Request, SamplingParams


def build(arch: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench.grpo_step import ARCHITECTURES
    from bench.multi_gpu import LARGE_ARCHITECTURES

    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: the same weights on every rank (one seed, one kind)
        config = Qwen2Config(**{**ARCHITECTURES, **LARGE_ARCHITECTURES}[arch])
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval().requires_grad_(False)


def run(backend: EngineBackend, prompts: list[list[int]], new_tokens: int, temperature: float = 1.0) -> list:
    params = SamplingParams(max_tokens=new_tokens, temperature=temperature, ignore_eos=True, seed=0)
    rollouts = backend.generate([Request(str(i), p, params) for i, p in enumerate(prompts)])
    assert all(len(r.completion_ids) == new_tokens for r in rollouts), "a sequence stopped early"
    return [r.completion_ids for r in rollouts]


def step_times(backend: EngineBackend, shapes: list[tuple[int, int, int]], vocab: int, device: torch.device) -> list:
    rows = []
    for batch, prompt_len, new in shapes:
        run(backend, random_prompts(batch, prompt_len, vocab, seed=batch), min(new, 32))  # warm-up
        prompts = random_prompts(batch, prompt_len, vocab, seed=batch + 1)
        total = timed(device, lambda: run(backend, prompts, new))
        fresh = random_prompts(batch, prompt_len, vocab, seed=batch + 2)
        prefill = timed(device, lambda: run(backend, fresh, 1))
        rows.append({"batch": batch, "prompt": prompt_len, "new": new, "total_s": total, "prefill_s": prefill,
                     "decode_step_ms": (total - prefill) / (new - 1) * 1e3})
        print(f"  batch {batch} {prompt_len}+{new}: step {rows[-1]['decode_step_ms']:.2f} ms", flush=True)
    return rows


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def logits_at(model: torch.nn.Module, ids: torch.Tensor, rows: slice) -> torch.Tensor:
    """[len(rows), vocab] float logits of a whole model or a shard (whose lm_head takes [S, hidden])."""
    hidden = model.model(ids).last_hidden_state[0, rows]
    return model.lm_head(hidden.contiguous()).float()


@torch.no_grad()
def parity(model, shard, prompts: list[list[int]], whole: list | None, split: list[list[int]], device,
           rank: int) -> dict | None:
    """Collective (every rank runs the shard). On rank 0: exact sequences; the teacher-forced logit noise between
    the whole model and the shard over prompt + the whole engine's tokens; each first difference's whole-model gap
    against its position's noise (module docstring)."""
    import torch.distributed as dist

    shared = [whole]
    dist.broadcast_object_list(shared, src=0)
    whole = shared[0]
    noise, differences = [], []
    for prompt, a, b in zip(prompts, whole, split):
        ids = torch.tensor([prompt + a], device=device)
        rows = slice(len(prompt) - 1, len(prompt) + len(a) - 1)  # the logits that chose a's tokens
        split_logits = logits_at(shard, ids, rows)
        if rank != 0:
            continue
        whole_logits = logits_at(model, ids, rows)
        noise.append((whole_logits - split_logits).abs().amax(-1))
        at = first_difference(a, b)
        if at is not None:
            row, top = whole_logits[at], whole_logits[at].topk(2).values
            differences.append({"position": at, "gap": float(row[a[at]] - row[b[at]]),
                                "top2_gap": float(top[0] - top[1]), "noise": float(noise[-1][at])})
    if rank != 0:
        return None
    noise = torch.cat(noise)
    ties = sum(d["gap"] <= d["noise"] for d in differences)
    return {"sequences": len(prompts), "exact": sum(a == b for a, b in zip(whole, split)),
            "differences": differences, "ties": ties, "mismatches": len(differences) - ties,
            "noise_max": float(noise.max()), "noise_median": float(noise.median()), "positions": noise.numel()}


def save(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-7b")
    parser.add_argument("--shapes", nargs="+", default=["1:128:512", "64:128:512", "1:1024:4096", "64:1024:4096"],
                        help="batch:prompt:new tokens")
    parser.add_argument("--parity-prompts", type=int, default=16)
    parser.add_argument("--parity-tokens", type=int, default=64)
    parser.add_argument("--kv-gib", type=float, default=24.0, help="KV cache of the whole model (shards: 1/N each)")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (EngineConfig.cuda_graphs off)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, short shapes, CPU and gloo")
    parser.add_argument("--out", type=Path, default=Path("bench/out/tp_decode.json"))
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="profile --profile-steps decode steps at each shape's batch and prompt (its new tokens "
                             "ignored) instead; JSON and traces in DIR")
    parser.add_argument("--profile-steps", type=int, default=32)
    args = parser.parse_args()
    if args.cpu_smoke:
        args.arch, args.shapes, args.parity_prompts, args.parity_tokens, args.kv_gib = "tiny", ["2:8:8"], 4, 8, 0.01

    from tandemrl.config import DistributedConfig
    from tandemrl.distributed.env import destroy_process_group, init_process_group
    from tandemrl.distributed.tp_weights import tensor_parallel_group

    info = init_process_group(DistributedConfig(), "cpu" if args.cpu_smoke else "auto")
    device, world = info.device, info.world_size
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(args.arch, device, dtype)
    vocab = model.config.vocab_size
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes]
    parity_ids = random_prompts(args.parity_prompts, 32, vocab, seed=7)
    probe = EngineBackend(model, None, EngineConfig(num_blocks=1), device=device)
    block_bytes = probe.runner.bytes_per_block(16)
    probe.close()
    num_blocks = max(64, int(args.kv_gib * 2**30 // block_bytes))
    max_seqs = max(b for b, _, _ in shapes + [(args.parity_prompts, 0, 0)])
    result = {"date": date.today().isoformat(), "torch": torch.__version__, "arch": args.arch, "ranks": world,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "cuda_graphs": not args.eager, "num_blocks_whole": num_blocks}
    import torch.distributed as dist

    if args.profile is not None:
        profile(args, info, model, EngineConfig(num_blocks=num_blocks, max_num_seqs=max_seqs,
                                                cuda_graphs=not args.eager), [(b, p) for b, p, _ in shapes], result)
        destroy_process_group()
        return
    whole_tokens = None
    if info.rank == 0:
        print(f"=== one GPU, whole model ({num_blocks} blocks)", flush=True)
        config = EngineConfig(num_blocks=num_blocks, max_num_seqs=max_seqs, cuda_graphs=not args.eager)
        whole = EngineBackend(model, None, config, device=device)
        result["whole"] = step_times(whole, shapes, vocab, device)
        whole_tokens = run(whole, parity_ids, args.parity_tokens, temperature=0.0)
        whole.close()
        save(args.out, result)  # a run cut short keeps the one-GPU rows
    dist.barrier()
    group = tensor_parallel_group(info.rank, world, world)
    print(f"=== rank {info.rank}: tensor-parallel engine over {world} ranks", flush=True)
    config = EngineConfig(num_blocks=num_blocks, max_num_seqs=max_seqs, cuda_graphs=not args.eager,
                          tensor_parallel_size=world)
    split = EngineBackend(model, None, config, device=device, tensor_parallel=group)
    rows = step_times(split, shapes, vocab, device)
    split_tokens = run(split, parity_ids, args.parity_tokens, temperature=0.0)
    shard = split.engine_model
    split.close()
    checked = parity(model, shard, parity_ids, whole_tokens, split_tokens, device, info.rank)
    if device.type == "cuda":
        result["split_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if info.rank == 0:
        result["split"], result["parity"] = rows, checked
        result["ratio"] = [s["decode_step_ms"] / w["decode_step_ms"] for s, w in zip(rows, result["whole"])]
        save(args.out, result)
        report(result)
    dist.barrier()
    destroy_process_group()


def profile(args, info, model: torch.nn.Module, config: EngineConfig, shapes: list[tuple[int, int]],
            result: dict) -> None:
    """--profile: rank 0's whole engine (the others wait), then every rank's shard; rank 0 prints both."""
    import dataclasses

    import torch.distributed as dist

    from bench import tp_profile
    from tandemrl.distributed.tp_weights import tensor_parallel_group

    device, vocab, steps = info.device, model.config.vocab_size, args.profile_steps
    args.profile.mkdir(parents=True, exist_ok=True)
    if info.rank == 0:
        print("=== profile: one GPU, whole model", flush=True)
        whole = EngineBackend(model, None, config, device=device)
        result["whole"] = tp_profile.profile_shapes(whole, run, shapes, steps, vocab, device, args.profile, "whole")
        whole.close()
    dist.barrier()
    group = tensor_parallel_group(info.rank, info.world_size, info.world_size)
    split_config = dataclasses.replace(config, tensor_parallel_size=info.world_size)
    split = EngineBackend(model, None, split_config, device=device, tensor_parallel=group)
    traces = args.profile if info.rank == 0 else None
    label = f"tp{info.world_size}"
    result["split"] = tp_profile.profile_shapes(split, run, shapes, steps, vocab, device, traces, label)
    split.close()
    save(args.profile / f"tp_profile_rank{info.rank}.json", result)
    if info.rank == 0:
        tp_profile.report(result["whole"], result["split"], info.world_size)
    dist.barrier()


def report(result: dict) -> None:
    print("| batch | prompt+new | 1 GPU step ms | TP step ms | TP / 1 GPU |")
    for w, s, ratio in zip(result["whole"], result["split"], result["ratio"]):
        print(f"| {w['batch']} | {w['prompt']}+{w['new']} | {w['decode_step_ms']:.2f} | {s['decode_step_ms']:.2f} | "
              f"{ratio:.2f} |")
    p = result["parity"]
    print(f"greedy parity: {p['exact']}/{p['sequences']} sequences exact; teacher-forced logit noise over "
          f"{p['positions']} positions: max {p['noise_max']:.4f}, median {p['noise_median']:.4f}; first differences: "
          f"{p['ties']} rounding ties (gap within the position's noise), {p['mismatches']} mismatches; "
          f"(position, gap, noise): {[(d['position'], round(d['gap'], 3), round(d['noise'], 3)) for d in p['differences']]}")


if __name__ == "__main__":
    main()
