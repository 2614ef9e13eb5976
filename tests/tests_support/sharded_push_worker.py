"""The processes of tests/sync/test_nccl_sharded_push.py (torch.multiprocessing): processes 0 and 1 are an FSDP2
trainer job (gloo), process 2 the server's side of the push; the trainer's rank 0 sends, rank 1 only gathers."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from tandemrl.sync import nccl
from tandemrl.train.sharding import shard_model

TRAINER_RANKS = 2


def scaled_model(model_dir: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # weights the receiver does not start from
    return model


def run(process: int, store_file: str, init_method: str, model_dir: str, bucket_bytes: int, result_file: str) -> None:
    torch.set_num_threads(1)
    if process == TRAINER_RANKS:  # the receiver
        expected = scaled_model(model_dir)
        group = nccl.open_group(init_method, 1, "gloo", 60)
        received = nccl.receive_parameters(group, nccl.parameter_specs(expected), bucket_bytes, torch.device("cpu"))
        worst = max((received[n] - p.detach()).abs().max().item() for n, p in nccl.named_weights(expected))
        with open(result_file, "w") as out:
            json.dump({"max_diff": worst, "tensors": len(received)}, out)
        return
    dist.init_process_group("gloo", store=dist.FileStore(store_file, TRAINER_RANKS), rank=process,
                            world_size=TRAINER_RANKS)
    try:
        model = scaled_model(model_dir)
        specs = nccl.parameter_specs(model)
        shard_model(model)
        assert nccl.parameter_specs(model) == specs  # the shards announce the full shapes
        group = nccl.open_group(init_method, 0, "gloo", 60) if process == 0 else None
        nccl.send_parameters(model, group, bucket_bytes)
        dist.barrier()
    finally:
        dist.destroy_process_group()
