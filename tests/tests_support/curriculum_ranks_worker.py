"""The processes of tests/distributed/test_torchrun_curriculum.py (torch.multiprocessing, gloo): each rank records its
share of one step's rewards through Distributed.all_shares, ends the epoch and writes its curriculum state."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from tandemrl.config import CurriculumConfig
from tandemrl.curriculum import Curriculum
from tandemrl.distributed.env import RankInfo
from tandemrl.distributed.parallel import Distributed

RANKS = 2


def run(rank: int, store_file: str, ids: list[int], rewards: list[float], out_prefix: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_file, RANKS), rank=rank, world_size=RANKS)
    try:
        parallel = Distributed(RankInfo(rank=rank, world_size=RANKS, local_rank=rank, device=torch.device("cpu")))
        curriculum = Curriculum(CurriculumConfig(), sorted(set(ids)), 4)
        records = parallel.all_shares(list(zip(parallel.local_share(ids), parallel.local_share(rewards))))
        curriculum.record([i for i, _ in records], [r for _, r in records])
        curriculum.end_epoch(1)
        with open(f"{out_prefix}{rank}.json", "w") as out:
            json.dump(curriculum.state_dict(), out)
    finally:
        dist.destroy_process_group()
