"""The curriculum under torchrun: every rank records every rank's rewards (Distributed.all_shares), so all keep the
state one process would; a 2-rank `torchrun -m tandemrl train` on the CPU (gloo) re-buckets over the whole train set."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tandemrl.config import CurriculumConfig
from tandemrl.curriculum import Curriculum
from tandemrl.models.tiny import ensure_tiny_model
from tandemrl.telemetry.writers import read_metrics
from tandemrl.train.checkpoint import find_latest
from tests.distributed.test_torchrun import torchrun


def test_every_rank_keeps_the_curriculum_one_process_would(tmp_path):
    generator = random.Random(3)
    ids = [i for i in range(40) for _ in range(2)]  # 40 prompts, 2 rollouts each: 20 prompts a rank
    rewards = [(0.1 if i % 3 == 0 else 0.9) + generator.uniform(-0.05, 0.05) for i in ids]  # hard and easy prompts
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned processes import tests_support
        from tests_support.curriculum_ranks_worker import RANKS, run
        from tests_support.spawn import spawn_ranks

        spawn_ranks(run, (str(tmp_path / "store"), ids, rewards, str(tmp_path / "rank")), RANKS, tmp_path / "store")
    one = Curriculum(CurriculumConfig(), list(range(40)), 4)
    one.record(ids, rewards)
    one.end_epoch(1)
    expected = json.loads(json.dumps(one.state_dict()))
    states = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    assert states[0] == states[1] == expected
    assert len(expected["ema"]["ids"]) == 40 and len(set(expected["rollouts"])) > 1  # not trivially equal


def test_a_two_rank_run_buckets_every_train_sample(tmp_path):
    tiny = ensure_tiny_model(tmp_path / "tiny")
    # 8 train samples, 4 prompts a step: an epoch is 2 steps; step 3 samples with the buckets' group sizes
    settings = [f'model.tiny_dir="{tiny}"', "curriculum.enabled=true", "curriculum.min_samples=4",
                "reward.inference.tokens=0.05", "data.train_limit=8", "rollout.prompts_per_step=4",
                "rollout.group_size=4", "rollout.max_tokens=6", "train.max_steps=3", "eval.limit=4", "eval.pass_k=0",
                "checkpoint.every_steps=0", "log.tensorboard=false", "distributed.timeout_s=60"]
    done = torchrun(tmp_path, 2, "--out", "run", *[a for s in settings for a in ("--set", s)])
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads((tmp_path / "run" / "curriculum" / "epoch-001.json").read_text())
    assert report["samples_seen"] == 8  # both ranks' prompts, not rank 0's 4
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    saved = json.loads((find_latest(tmp_path / "run" / "checkpoints") / "trainer_state.json").read_text())
    assert sorted(saved["curriculum"]["ema"]["ids"]) == list(range(8))
