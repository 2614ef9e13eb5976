"""2 processes (gloo on the CPU) give the loss and the parameter update of 1 process on the same batch, sharded
(FSDP2) and replicated (full fine-tuning and LoRA), and a sharded job's DCP checkpoint loads into a job of another
size (here 1 process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from tandemrl.config import TrainConfig
from tandemrl.distributed.env import RankInfo
from tandemrl.distributed.fsdp import WeightGather, plain_replica
from tandemrl.distributed.parallel import Distributed
from tandemrl.models.tiny import ensure_tiny_model
from tandemrl.train.checkpoint import find_latest
from tandemrl.train.distributed_checkpoint import load_distributed
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.sharding import shard_model


# token-mean: the ranks hold different token counts, so only global normalisers give the 1-process loss;
# seq-mean-token-mean: the sequence count normalises (divided by the world size, it is fractional in general).
AGGREGATIONS = ["token-mean", "seq-mean-token-mean"]
# AdamW's first step moves every weight by about lr (1e-2) whatever its gradient's size: a gradient near AdamW's eps
# that differs in its last bits (another summation order, a padded instead of a packed micro-batch) moves its weight
# by a few 1e-5 more; a missing or doubled gradient reduction moves weights by ~1e-2.
PARAM_TOL = 1e-4


@pytest.fixture(scope="module")
def two_rank_update(tmp_path_factory) -> tuple[dict, Path, Path]:
    root = tmp_path_factory.mktemp("fsdp")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned ranks import tests_support
        from tests_support.fsdp_update_worker import run_rank
        from tests_support.spawn import spawn_ranks

        model_dir = ensure_tiny_model(root / "tiny")
        spawn_ranks(run_rank, (2, str(root / "store"), str(model_dir), str(root / "result.json"), AGGREGATIONS,
                               str(root / "checkpoints")), 2, root / "store")
    return json.loads((root / "result.json").read_text()), model_dir, root / "checkpoints"


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_two_ranks_match_one_process(two_rank_update, aggregation):
    result = two_rank_update[0][aggregation]
    ref, sharded = result["reference"], result["sharded"]
    # the step moved the weights, and the ranks hold different token counts (only global normalisers match)
    assert result["update_size"] > 1e-3
    assert result["param_diff"] < PARAM_TOL, result
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "ratio_mean", "mismatch/logp_abs_mean", "tis/weight_mean"):
        assert sharded[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert sharded["mismatch/logp_abs_max"] == pytest.approx(ref["mismatch/logp_abs_max"], rel=1e-6)
    assert result["gather_s"] >= 0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kind", ["replicated", "lora"])
def test_replicated_ranks_match_one_process_and_the_sharded_job(two_rank_update, aggregation, kind):
    result = two_rank_update[0][aggregation]
    replicated = result[kind]
    ref, got = replicated["reference"], replicated["replicated"]
    assert replicated["update_size"] > 1e-3 and replicated["ranks_differ"] == 0.0, replicated
    assert replicated["param_diff"] < PARAM_TOL, replicated
    if kind == "lora":
        assert replicated["trained"] == 2 * 2 * 2  # A and B of q_proj and v_proj in 2 layers: the base stays frozen
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "ratio_mean", "tis/weight_mean"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
        if kind == "replicated":  # the same numbers as FSDP2's
            assert got[key] == pytest.approx(result["sharded"][key], rel=1e-5, abs=1e-7), key


def test_a_two_rank_checkpoint_loads_into_one_process(two_rank_update, tmp_path):
    from transformers import AutoModelForCausalLM

    _, model_dir, checkpoints = two_rank_update
    latest = find_latest(checkpoints)
    assert latest is not None
    saved = load_file(latest / "model.safetensors")  # the full weights rank 0 wrote from the engine replica
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        replica = plain_replica(model)
        shard_model(model)
        cfg = TrainConfig(lr=1e-2)
        optimizer = build_optimizer(model, cfg)
        parallel = Distributed(RankInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
        state = load_distributed(latest, parallel=parallel, model=model, optimizer=optimizer,
                                 scheduler=build_scheduler(optimizer, cfg))
        WeightGather(model, replica).refresh()
        assert state == {"step": 1}
        weights = dict(replica.named_parameters())
        assert max(float((weights[k] - v).abs().max()) for k, v in saved.items()) == 0.0
        moments = [s["exp_avg_sq"] for s in optimizer.state.values()]
        assert len(moments) == len(weights) and all(float(m.full_tensor().abs().sum()) > 0 for m in moments)
    finally:
        dist.destroy_process_group()


def test_a_lora_checkpoint_holds_the_adapter_and_resumes(tmp_path):
    """Replicated LoRA: DCP keeps the adapter and its AdamW state (not the frozen base) and loads them back."""
    from transformers import AutoModelForCausalLM

    from tandemrl.models.lora import LoraSettings, apply_lora
    from tandemrl.train.distributed_checkpoint import save_distributed

    model_dir = ensure_tiny_model(tmp_path / "tiny")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        parallel = Distributed(RankInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
        cfg = TrainConfig(lr=1e-2)

        def lora_model(seed: int):
            torch.manual_seed(seed)
            model = apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                               LoraSettings(rank=4, target_modules=["q_proj"]))
            optimizer = build_optimizer(model, cfg)
            for p in model.parameters():  # one step gives AdamW a state to save
                p.grad = torch.ones_like(p) if p.requires_grad else None
            optimizer.step()
            return model, optimizer, build_scheduler(optimizer, cfg)

        model, optimizer, scheduler = lora_model(1)
        saved = save_distributed(tmp_path / "ckpt", 1, parallel=parallel, model=model, replica=model, tokenizer=None,
                                 optimizer=optimizer, scheduler=scheduler, trainer_state={"step": 1}, keep_last=1)
        assert (saved / "adapter_model.safetensors").is_file()
        import torch.distributed.checkpoint as dcp

        keys = [k for k in dcp.FileSystemReader(saved / "dcp").read_metadata().state_dict_metadata
                if k.startswith("model.")]
        # the frozen base is not in it (a tied lm_head's second name slips through DCP's frozen filter: kept, small)
        assert keys and all("lora_" in k or k.endswith("lm_head.weight") for k in keys), keys

        other, other_opt, other_sched = lora_model(2)  # another adapter, another optimizer state
        load_distributed(saved, parallel=parallel, model=other, optimizer=other_opt, scheduler=other_sched)
        want, got = dict(model.named_parameters()), dict(other.named_parameters())
        assert all(torch.equal(want[n], got[n]) for n in want)
        moments = [(optimizer.state[p]["exp_avg_sq"], other_opt.state[q]["exp_avg_sq"])
                   for p, q in zip(optimizer.param_groups[0]["params"], other_opt.param_groups[0]["params"])]
        assert moments and all(torch.equal(a, b) for a, b in moments)
    finally:
        dist.destroy_process_group()
