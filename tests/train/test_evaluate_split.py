"""Under torchrun each engine evaluates its share of the test prompts and every rank gets the result over all of them:
the result one process computes (greedy scores exactly), here with two engines' parts run one after the other in one
process (the part exchanged as `Distributed.all_shares` would, without a process group)."""

from __future__ import annotations

import dataclasses

import torch

from tandemrl.distributed.env import RankInfo
from tandemrl.distributed.parallel import Distributed
from tandemrl.train.evaluate import evaluate
from tandemrl.train.setup import build_run
from tests.train.test_loop import small_config


class OneOfTwoEngines(Distributed):
    """Rank ``rank`` of a 2-process job whose ``all_shares`` joins in rank order with the parts in ``exchanged``."""

    def __init__(self, rank: int, exchanged: dict[int, list]) -> None:
        super().__init__(RankInfo(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu")))
        self.exchanged = exchanged

    def all_shares(self, items):
        self.exchanged[self.rank] = list(items)
        return [item for rank in sorted(self.exchanged) for item in self.exchanged[rank]]


def test_two_engines_each_score_half_the_prompts_and_agree_with_one_process(tmp_path):
    cfg = small_config(tmp_path, "eval.limit=7", "eval.pass_k=2")  # 7: the shares are unequal (4 and 3)
    run = build_run(cfg, tmp_path / "run")
    asked: list[int] = []
    generate = run.backend.generate

    def counting(requests, *args, **kwargs):
        asked.append(len(requests))
        return generate(requests, *args, **kwargs)

    run.backend.generate = counting  # type: ignore[method-assign]
    whole = evaluate(run.backend, run.encoder, run.test_samples, run.reward, cfg, 0)
    whole_requests, asked[:] = sum(asked), []

    exchanged: dict[int, list] = {}
    evaluate(run.backend, run.encoder, run.test_samples, run.reward, cfg, 0, parallel=OneOfTwoEngines(1, exchanged))
    second_requests, asked[:] = sum(asked), []
    split = evaluate(run.backend, run.encoder, run.test_samples, run.reward, cfg, 0,
                     parallel=OneOfTwoEngines(0, exchanged))
    first_requests = sum(asked)

    assert whole.num_prompts == split.num_prompts == 7 and split.pass_at_k is not None
    # greedy scores are the same; the pass@k samples are not (an engine's random stream is per batch, and the
    # batches differ), but they are counted over all 7 prompts
    assert {**dataclasses.asdict(split), "pass_at_k": None} == {**dataclasses.asdict(whole), "pass_at_k": None}
    assert abs(split.pass_at_k * 7 - round(split.pass_at_k * 7)) < 1e-9
    per_prompt = whole_requests // 7  # 1 greedy + pass_k sampled completions
    assert (first_requests, second_requests) == (4 * per_prompt, 3 * per_prompt)
