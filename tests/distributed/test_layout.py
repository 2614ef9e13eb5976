"""Rank layout: torchrun's environment, the prompt split, metric reduction, the checks before a job starts."""

from __future__ import annotations

import pytest
import torch

from tandemrl.config import load_config
from tandemrl.distributed.env import RankInfo, launched_by_torchrun, read_rank_env
from tandemrl.distributed.launch import check_layout
from tandemrl.distributed.parallel import Distributed, SingleProcess, combine_metrics


def rank(r: int, world: int) -> Distributed:
    return Distributed(RankInfo(rank=r, world_size=world, local_rank=r, device=torch.device("cpu")))


def test_torchrun_environment_is_read_and_checked():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert launched_by_torchrun(env) and not launched_by_torchrun({"RANK": "0"})
    assert read_rank_env(env) == (1, 2, 1)
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        read_rank_env({**env, "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="0 <= RANK < WORLD_SIZE"):
        read_rank_env({**env, "RANK": "2"})


def test_each_rank_takes_a_contiguous_share_of_whole_prompts():
    prompts = list("abcdef")
    assert [rank(r, 3).local_share(prompts) for r in range(3)] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert SingleProcess().local_share(prompts) == prompts
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        rank(0, 4).local_share(prompts)
    assert len({rank(r, 2).rollout_seed(7) for r in range(2)}) == 2


def test_metrics_combine_by_kind():
    per_rank = [
        {"step": 3, "loss": 0.5, "tokens_per_s": 100.0, "mismatch/logp_abs_max": 0.1, "memory/peak_gb": 1.0,
         "response_length/max": 4, "only_here": 2.0},
        {"step": 3, "loss": 0.7, "tokens_per_s": 300.0, "mismatch/logp_abs_max": 0.3, "memory/peak_gb": 2.0,
         "response_length/max": 6},
    ]
    combined = combine_metrics(per_rank, frozenset({"tokens_per_s"}))
    assert combined == {"step": 3, "loss": pytest.approx(0.6), "tokens_per_s": 400.0, "mismatch/logp_abs_max": 0.3,
                        "memory/peak_gb": 2.0, "response_length/max": 6, "only_here": 2.0}


def test_a_std_beside_its_mean_is_pooled_over_ranks():
    import statistics

    shares = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.5]]
    per_rank = [{"reward/mean": statistics.fmean(x), "reward/std": statistics.pstdev(x)} for x in shares]
    combined = combine_metrics(per_rank, frozenset())
    whole = shares[0] + shares[1]
    assert combined["reward/mean"] == pytest.approx(statistics.fmean(whole))
    assert combined["reward/std"] == pytest.approx(statistics.pstdev(whole))


def test_layouts_that_cannot_split_fail_before_any_work():
    cfg = load_config(None, ["rollout.prompts_per_step=6", "rollout.group_size=2", "train.mini_batches=4"])
    with pytest.raises(ValueError, match="rollout.prompts_per_step = 6 must be a multiple of the 4 processes"):
        check_layout(cfg, 4)
    with pytest.raises(ValueError, match="train.mini_batches = 4 must divide each rank's 6 samples"):
        check_layout(cfg, 2)
    check_layout(load_config(None, ["rollout.prompts_per_step=8"]), 2)
    check_layout(load_config(None, ["model.lora.enabled=true"]), 2)  # LoRA replicates
    with pytest.raises(ValueError, match="distributed.strategy = 'shard' does not take model.lora.enabled"):
        check_layout(load_config(None, ["model.lora.enabled=true", "distributed.strategy=shard"]), 2)


def test_tensor_parallel_ranks_share_prompts_and_seeds_and_split_the_training_rows():
    def tp_rank(r: int, world: int) -> Distributed:
        return Distributed(RankInfo(rank=r, world_size=world, local_rank=r, device=torch.device("cpu")), 2)

    prompts = list("abcd")
    assert [tp_rank(r, 4).local_share(prompts) for r in range(4)] == [["a", "b"], ["a", "b"], ["c", "d"], ["c", "d"]]
    seeds = [tp_rank(r, 4).rollout_seed(7) for r in range(4)]
    assert seeds[0] == seeds[1] != seeds[2] == seeds[3]
    rows = list(range(8))
    assert [rows[tp_rank(r, 4).train_rows(8)] for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rows[rank(0, 2).train_rows(8)] == rows


def test_tensor_parallel_layouts_that_cannot_split_fail_before_any_work():
    tp = ["engine.tensor_parallel_size=2", "rollout.group_size=2"]
    with pytest.raises(ValueError, match="engine.tensor_parallel_size = 2 must divide the 3 processes"):
        check_layout(load_config(None, [*tp, "rollout.prompts_per_step=6"]), 3)
    with pytest.raises(ValueError, match="must be a multiple of the 2 engines"):
        check_layout(load_config(None, [*tp, "rollout.prompts_per_step=3"]), 4)
    with pytest.raises(ValueError, match="train.mini_batches = 4 must divide each rank's 2 samples"):
        check_layout(load_config(None, [*tp, "rollout.prompts_per_step=4", "train.mini_batches=4"]), 4)
    with pytest.raises(ValueError, match="engine.tensor_parallel_size = 2 does not take model.lora.enabled"):
        check_layout(load_config(None, [*tp, "rollout.prompts_per_step=4", "model.lora.enabled=true"]), 2)
    check_layout(load_config(None, [*tp, "rollout.prompts_per_step=4", "train.mini_batches=1"]), 4)


def test_the_server_backend_takes_the_sync_kinds_that_work_over_ranks():
    server = ["rollout.backend=server", "rollout.server_url=http://127.0.0.1:1"]
    check_layout(load_config(None, [*server, "sync.kind=nccl", "sync.nccl_init_method=tcp://127.0.0.1:2"]), 2)
    check_layout(load_config(None, [*server, "sync.kind=checkpoint"]), 2)
    check_layout(load_config(None, [*server, "sync.kind=lora", "model.lora.enabled=true"]), 2)
    with pytest.raises(ValueError, match="sync.kind = 'ipc' is not supported under torchrun"):
        check_layout(load_config(None, [*server, "sync.kind=ipc"]), 2)
    with pytest.raises(ValueError, match="engine.tensor_parallel_size = 2 splits the trainer's own engine"):
        check_layout(load_config(None, [*server, "sync.kind=checkpoint", "engine.tensor_parallel_size=2"]), 2)
    with pytest.raises(ValueError, match="rollout.backend = 'hf' is not supported under torchrun"):
        check_layout(load_config(None, ["rollout.backend=hf"]), 2)


def test_checkpoints_resume_only_in_their_own_mode(tmp_path):
    import json

    from tandemrl.train.distributed_checkpoint import require_distributed_format
    from tandemrl.train.weights_io import CheckpointError

    def checkpoint(name: str, model_format: str):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"_checkpoint": {"model_format": model_format}}))
        return folder

    sharded, plain = checkpoint("sharded", "fsdp-dcp"), checkpoint("plain", "full")
    require_distributed_format(sharded, distributed=True)
    require_distributed_format(plain, distributed=False)
    with pytest.raises(CheckpointError, match="resume it with `torchrun"):
        require_distributed_format(sharded, distributed=False)
    with pytest.raises(CheckpointError, match="saved by a single-process run"):
        require_distributed_format(plain, distributed=True)
