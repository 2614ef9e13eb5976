"""One rank of the tensor-parallel weight refresh test (tests/distributed/test_tp_weights.py): the trained model is
FSDP2-sharded over every rank; each rank's engine shard, refreshed from those shards, must equal the shard cut from
the whole model (and so must the one refreshed from replicated training's whole tensors). Rank 0 writes what it
saw."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from tandemrl.distributed.tp_weights import TensorParallelWeights, tensor_parallel_group
from tandemrl.models.tensor_parallel import empty_shard, shard_for_rank
from tandemrl.train.sharding import shard_model

CONFIGS = {  # 1 KV head (replicated when split 2 ways) and an odd vocabulary; Qwen2.5-0.5B's heads, untied
    "kv1": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, intermediate_size=96,
                num_hidden_layers=2, vocab_size=101, tie_word_embeddings=True),
    "qwen": dict(hidden_size=128, num_attention_heads=14, num_key_value_heads=2, intermediate_size=224,
                 head_dim=32, num_hidden_layers=1, vocab_size=250, tie_word_embeddings=False),
}


def run_rank(rank: int, layouts: list[tuple[int, int]], store_prefix: str, result_file: str) -> None:
    """Each (world, tp_size) layout in turn, in a process group of its own over the first ``world`` ranks (one
    launch of max(world) processes for all: a fresh process costs seconds of imports). Rank 0 writes
    {"world-tp_size": result}."""
    torch.set_num_threads(1)
    results = {}
    for world, tp_size in layouts:
        if rank < world:
            results[f"{world}-{tp_size}"] = _run_layout(rank, world, tp_size, f"{store_prefix}-{world}-{tp_size}")
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump(results, f)


def _run_layout(rank: int, world: int, tp_size: int, store_file: str) -> dict:
    dist.init_process_group("gloo", store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    try:
        group = tensor_parallel_group(rank, world, tp_size)
        results = {}
        for name, config in CONFIGS.items():
            torch.manual_seed(0)
            whole = Qwen2ForCausalLM(Qwen2Config(**config)).float()
            expected = shard_for_rank(whole, group)
            replicated = Qwen2ForCausalLM(Qwen2Config(**config)).float()  # replicated training: whole tensors
            replicated.load_state_dict(whole.state_dict())
            local = empty_shard(replicated, group)
            TensorParallelWeights(replicated, local, tp_size).refresh()
            local_params = dict(local.named_parameters())
            mismatched_local = [n for n, p in expected.named_parameters() if not torch.equal(p, local_params[n])]
            trained = Qwen2ForCausalLM(Qwen2Config(**config)).float()
            trained.load_state_dict(whole.state_dict())
            shard_model(trained)
            engine = empty_shard(trained, group)
            weights = TensorParallelWeights(trained, engine, tp_size)
            seconds = weights.refresh()
            got = dict(engine.named_parameters())
            mismatched = [n for n, p in expected.named_parameters() if not torch.equal(p, got[n])]
            with torch.no_grad():  # an update: the next refresh must bring it
                for model in (trained, whole):
                    for p in model.parameters():
                        p.add_(1.0)
            weights.refresh()
            updated = shard_for_rank(whole, group)
            stale = [n for n, p in updated.named_parameters() if not torch.equal(p, got[n])]
            mismatched_all = [None] * world
            dist.all_gather_object(mismatched_all, {"mismatched": mismatched, "stale": stale,
                                                    "replicated": mismatched_local})
            results[name] = {"ranks": mismatched_all, "seconds": seconds,
                             "engine_params": sum(p.numel() for p in engine.parameters()),
                             "whole_params": sum(p.numel() for p in whole.parameters())}
        return results
    finally:
        dist.destroy_process_group()
