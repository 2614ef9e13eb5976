"""One rank of the 2-process FSDP2 test (tests/distributed/test_fsdp_update.py), run by torch.multiprocessing.

Every rank also runs the single-process update on the whole batch (cheap on the tiny model), so rank 0 can report
how far the sharded update is from it.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import torch
import torch.distributed as dist

from tandemrl.config import TrainConfig
from tandemrl.distributed.env import RankInfo
from tandemrl.distributed.fsdp import WeightGather, plain_replica
from tandemrl.distributed.parallel import Distributed
from tandemrl.train.batch import TrainBatch, build_batch
from tandemrl.train.distributed_checkpoint import save_distributed
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.sharding import shard_model
from tandemrl.train.update import policy_update
from tandemrl.types import Rollout

ROWS, MAX_COMPLETION = 8, 6
COMPLETION_LENGTHS = [1, 2, 1, 2, 6, 5, 6, 4]  # rank 0 of 2 holds far fewer completion tokens than rank 1


def global_batch(vocab: int, seed: int = 0) -> TrainBatch:
    """Rows of different prompt and completion lengths and loss weights (tandem-like 0.2s): ranks hold different
    token counts, so only global normalisers give the single-process loss."""
    rng = random.Random(seed)
    rollouts = []
    for i in range(ROWS):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
        completion = [rng.randrange(3, vocab) for _ in range(COMPLETION_LENGTHS[i])]
        weights = [rng.choice([1.0, 0.2]) for _ in completion]
        logprobs = [-rng.uniform(0.5, 4.0) for _ in completion]
        rollouts.append(Rollout(f"r{i}", prompt, completion, logprobs, "stop", loss_weights=weights))
    advantages = torch.tensor([rng.uniform(-1.5, 1.5) for _ in range(ROWS)])
    return build_batch(rollouts, advantages, pad_id=0, device=torch.device("cpu"))


def run_rank(rank: int, world: int, store_file: str, model_dir: str, result_file: str, aggregations: list[str],
             checkpoint_root: str) -> None:
    """For each loss aggregation, the 1-process, the sharded and the replicated update (full and LoRA); the first
    one's sharded job is also checkpointed."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    try:
        parallel = Distributed(RankInfo(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu")))
        results = {name: compare_update(parallel, model_dir, name, checkpoint_root if i == 0 else None)
                   for i, name in enumerate(aggregations)}
        for name in aggregations:
            results[name]["replicated"] = compare_replicated(parallel, model_dir, name, lora=False)
            results[name]["lora"] = compare_replicated(parallel, model_dir, name, lora=True)
        if rank == 0:
            Path(result_file).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def compare_update(parallel: Distributed, model_dir: str, aggregation: str, checkpoint_root: str | None) -> dict:
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(lr=1e-2, micro_batch_size=3, aggregation=aggregation, tis_cap=2.0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = global_batch(model.config.vocab_size)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}

    reference = copy.deepcopy(model)
    ref_opt = build_optimizer(reference, cfg)
    ref = policy_update(reference, batch, ref_opt, build_scheduler(ref_opt, cfg), cfg, 1.0, MAX_COMPLETION)

    replica = plain_replica(model)
    shard_model(model)
    gather = WeightGather(model, replica)
    per_rank = ROWS // parallel.world_size
    local = batch.rows(slice(parallel.rank * per_rank, (parallel.rank + 1) * per_rank))
    opt = build_optimizer(model, cfg)
    scheduler = build_scheduler(opt, cfg)
    upd = policy_update(model, local, opt, scheduler, cfg, 1.0, MAX_COMPLETION, parallel.global_norm)
    metrics = parallel.reduce_metrics(upd.metrics)
    seconds = gather.refresh()
    if checkpoint_root is not None:
        save_distributed(Path(checkpoint_root), 1, parallel=parallel, model=model, replica=replica, tokenizer=None,
                         optimizer=opt, scheduler=scheduler, trainer_state={"step": 1}, keep_last=2)
    ref_params = dict(reference.named_parameters())
    with torch.no_grad():
        return {
            "reference": ref.metrics, "sharded": metrics, "gather_s": seconds,
            "param_diff": max(float((p - ref_params[n]).abs().max()) for n, p in replica.named_parameters()),
            "update_size": max(float((p - initial[n]).abs().max()) for n, p in ref_params.items()),
        }


def compare_replicated(parallel: Distributed, model_dir: str, aggregation: str, lora: bool) -> dict:
    """The replicated update (distributed.strategy = "replicate"; with ``lora`` a peft adapter, as LoRA runs under
    torchrun) against the 1-process update of the whole batch."""
    from transformers import AutoModelForCausalLM

    from tandemrl.distributed.replicate import GradientAllReduce, broadcast_trainable
    from tandemrl.models.lora import LoraSettings, apply_lora

    cfg = TrainConfig(lr=1e-2, micro_batch_size=3, aggregation=aggregation, tis_cap=2.0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        torch.manual_seed(100 + parallel.rank)  # different adapters per rank: the broadcast must align them
        model = apply_lora(model, LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
        _nonzero_lora_b(model)
    broadcast_trainable(model)
    batch = global_batch(model.config.vocab_size if not lora else model.get_base_model().config.vocab_size)
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    reference = copy.deepcopy(model)
    ref_opt = build_optimizer(reference, cfg)
    ref = policy_update(reference, batch, ref_opt, build_scheduler(ref_opt, cfg), cfg, 1.0, MAX_COMPLETION)

    per_rank = ROWS // parallel.world_size
    local = batch.rows(slice(parallel.rank * per_rank, (parallel.rank + 1) * per_rank))
    opt = build_optimizer(model, cfg)
    upd = policy_update(model, local, opt, build_scheduler(opt, cfg), cfg, 1.0, MAX_COMPLETION, parallel.global_norm,
                        parallel.any, GradientAllReduce.of(model, parallel.world_size))
    ref_params = dict(reference.named_parameters())
    with torch.no_grad():
        trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
        rank_params = torch.cat([p.reshape(-1) for p in trained.values()])
        rank0 = rank_params.clone()
        dist.broadcast(rank0, src=0)
        return {
            "reference": ref.metrics, "replicated": parallel.reduce_metrics(upd.metrics),
            "trained": len(trained), "ranks_differ": float((rank_params - rank0).abs().max()),
            "param_diff": max(float((p - ref_params[n]).abs().max()) for n, p in trained.items()),
            "update_size": max(float((ref_params[n] - p0).abs().max()) for n, p0 in initial.items()),
        }


def _nonzero_lora_b(model: torch.nn.Module) -> None:
    """peft starts B at zero, so A would get no gradient on the first step: a random B makes both train."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
