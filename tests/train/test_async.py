"""rollout.mode = "async": the rollout worker, its queue, staleness, and runs against the synchronous loop (CPU)."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tandemrl.config import ConfigError, load_config
from tandemrl.rewards.composite import RewardResult
from tandemrl.train import weight_mirror
from tandemrl.train.async_rollouts import AsyncRollouts, RolloutWorker
from tandemrl.train.loop import train
from tandemrl.train.rollout_jobs import RolloutJob
from tandemrl.train.rollout_queue import QueuedGroups, RolloutProducerError, RolloutQueue
from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.train.scored_groups import join_groups
from tandemrl.types import Rollout, Sample, SamplingParams

from tests.train.test_loop import comparable, read_rows, small_config

ASYNC_ONLY = "async/"


def scored_group(index: int, version: int, size: int = 2, reward: float = 1.0) -> ScoredRollouts:
    """One group of ``size`` rollouts of sample ``index``, sampled by ``version``."""
    rollouts = [Rollout(f"s{index}-{j}", [1, 2], [3], [-0.5], "stop", policy_version=version) for j in range(size)]
    sample = Sample(index=index, prompt=f"p{index}", answer=None)
    result = RewardResult(total=[reward] * size, components={"acc": [reward] * size}, errors={},
                          first_traceback=None, nonfinite=0)
    return ScoredRollouts([sample] * size, [f"p{index}"] * size, rollouts, result, None, [0] * size)


# ------------------------------------------------------------------ the queue and the groups


def test_groups_join_into_one_batch_with_shifted_group_ids():
    batch = join_groups([scored_group(0, 3), scored_group(1, 4, size=3, reward=0.0)])
    assert batch.group_ids == [0, 0, 1, 1, 1]
    assert [s.index for s in batch.samples] == [0, 0, 1, 1, 1]
    assert batch.reward.total == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert batch.reward.components == {"acc": [1.0, 1.0, 0.0, 0.0, 0.0]}
    assert [r.policy_version for r in batch.rollouts] == [3, 3, 4, 4, 4]


def test_the_queue_drops_and_counts_stale_groups_and_keeps_the_fresh_ones_in_order():
    q = RolloutQueue(capacity_groups=8)
    for index, version in enumerate([5, 2, 4, 3]):
        q.put(QueuedGroups(scored_group(index, version), version))
    dropped = []
    taken = q.take(2, trainer_version=5, max_staleness=1, on_drop=dropped.append)
    assert [p.version for p in taken.parts] == [5, 4]
    assert taken.dropped_groups == 1 and [d.version for d in dropped] == [2]
    assert q.depth_groups == 1  # version 3 waits for the next take


def test_a_failed_producer_stops_the_take_with_its_message():
    q = RolloutQueue(capacity_groups=4)
    q.fail("the environment gsm8k died: boom")
    with pytest.raises(RolloutProducerError, match="gsm8k died: boom"):
        q.take(1, trainer_version=0, max_staleness=0)


def test_a_timed_out_take_gives_back_what_it_took_and_a_full_queue_pushes_back():
    q = RolloutQueue(capacity_groups=1)
    assert q.put(QueuedGroups(scored_group(0, 0), 0))
    assert not q.put(QueuedGroups(scored_group(1, 0), 0), timeout=0.05)  # full: the producer waits
    with pytest.raises(TimeoutError):
        q.take(2, trainer_version=0, max_staleness=0, timeout=0.1)
    assert q.depth_groups == 1


# ------------------------------------------------------------------ the worker and staleness


def versioned_worker(max_staleness: int) -> tuple[AsyncRollouts, nn.Linear, list[int]]:
    """A real worker and mirror whose 'sampling' records the version it holds and the weight it reads."""
    trainer, copy = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        trainer.weight.fill_(0.0)
        copy.weight.fill_(0.0)
    mirror = weight_mirror.WeightMirror(trainer, copy, version=0)
    seen = []

    def sample(job: RolloutJob, version: int) -> ScoredRollouts:
        seen.append(int(copy.weight.item()))
        return scored_group(job.index, version)

    worker = RolloutWorker(sample, mirror, RolloutQueue(capacity_groups=16))
    draw = lambda index: RolloutJob(index, [], 2, SamplingParams())
    return AsyncRollouts(draw, worker, max_staleness, groups_per_step=1, first_index=0), trainer, seen


def update(trainer: nn.Linear, source: AsyncRollouts, version: int) -> None:
    with torch.no_grad():
        trainer.weight.fill_(float(version))  # the weights of version v read v
    source.publish(version)


def test_stale_batches_are_dropped_counted_and_replaced_and_versions_are_recorded():
    source, trainer, seen = versioned_worker(max_staleness=1)
    try:
        first, metrics = source.next(step=0, trainer_version=0)  # jobs 0 and 1 go out, both sampled by version 0
        assert [r.policy_version for r in first.rollouts] == [0, 0] and metrics["async/dropped_groups"] == 0
        while source.producer.out.depth_groups < 1:  # job 1 done (version 0)
            pass
        update(trainer, source, 1)
        update(trainer, source, 2)  # two updates before the next take: job 1 is now 2 versions behind
        batch, metrics = source.next(step=1, trainer_version=2)
        assert metrics["async/dropped_groups"] == 1 and metrics["async/dropped_groups_total"] == 1
        assert [r.policy_version for r in batch.rollouts] == [2, 2]
        assert metrics["async/version_lag_max"] == 0
        assert seen[:3] == [0, 0, 2]  # job 2 read the weights of version 2: the versions tell the truth
    finally:
        source.close()


def test_a_worker_whose_weights_never_move_stops_the_run_with_a_message(monkeypatch):
    monkeypatch.setattr(weight_mirror.WeightMirror, "apply", lambda self: self.applied)
    source, trainer, _ = versioned_worker(max_staleness=0)
    try:
        source.next(step=0, trainer_version=0)
        update(trainer, source, 1)
        with pytest.raises(RolloutProducerError, match="weights do not follow the trainer's"):
            source.next(step=1, trainer_version=1)
    finally:
        source.close()


# ------------------------------------------------------------------ whole runs


def test_async_with_staleness_zero_reproduces_the_synchronous_run(tmp_path):
    base = ("train.max_steps=5", "train.lr=3e-3", "checkpoint.every_steps=0")
    sync_summary = train(small_config(tmp_path, *base), tmp_path / "sync")
    async_summary = train(small_config(tmp_path, *base, "rollout.mode=async"), tmp_path / "async")
    sync_rows, async_rows = read_rows(tmp_path / "sync"), read_rows(tmp_path / "async")
    assert sorted(async_rows) == sorted(sync_rows) == [1, 2, 3, 4, 5]
    for step in sync_rows:
        mine = {k: v for k, v in comparable(async_rows[step]).items() if not k.startswith(ASYNC_ONLY)}
        assert mine == comparable(sync_rows[step]), step  # rewards, loss, mismatch: the same batches, same weights
        assert async_rows[step]["async/version_lag_max"] == 0 and async_rows[step]["async/dropped_groups"] == 0
    assert async_summary["final"] == sync_summary["final"]


def test_async_with_staleness_one_samples_ahead_and_records_every_version(tmp_path):
    train(small_config(tmp_path, "train.max_steps=6", "checkpoint.every_steps=0", "rollout.mode=async",
                       "rollout.max_staleness=1", "train.tis_cap=2.0", "train.tis_mode=mask"), tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert all(rows[s]["async/version_lag_max"] <= 1 and rows[s]["async/dropped_groups"] == 0 for s in rows)
    assert all("tis/weight_mean" in rows[s] for s in rows)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    for row in samples:  # each rollout names the weights that sampled it: at most one update behind its step
        assert row["step"] - 2 <= row["policy_version"] <= row["step"] - 1


def test_a_worker_that_dies_stops_the_run_with_its_error(tmp_path, monkeypatch):
    import tandemrl.train.async_rollouts as async_rollouts

    real = async_rollouts.run_job

    def failing(run, job, backend, agent, version):
        if job.index == 2:
            raise RuntimeError("the rollout GPU fell off the bus")
        return real(run, job, backend, agent, version)

    monkeypatch.setattr(async_rollouts, "run_job", failing)
    with pytest.raises(RolloutProducerError, match="while sampling step 2's batch.*fell off the bus"):
        train(small_config(tmp_path, "rollout.mode=async"), tmp_path / "run")
    assert read_rows(tmp_path / "run").keys() == {1, 2}


def test_async_needs_the_engine_and_says_so():
    with pytest.raises(ConfigError, match="rollout.mode = 'async' samples with its own engine or from a `tandemrl serve`"):
        load_config(None, ["rollout.mode=async", "rollout.backend=hf"])
    with pytest.raises(ConfigError, match="rollout.async_device is set but has no effect"):
        load_config(None, ["rollout.async_device=cpu"])
    with pytest.raises(ConfigError, match="train.tis_mode is set but has no effect"):
        load_config(None, ["train.tis_mode=mask"])


def test_the_async_example_runs(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "async-tiny.toml"
    cfg = load_config(example, [f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "train.max_steps=3",
                                "rollout.prompts_per_step=4", "rollout.group_size=4", "eval.limit=8",
                                "eval.pass_k=0", "log.tensorboard=false"])
    summary = train(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert summary["steps"] == 3 and sorted(rows) == [1, 2, 3]
    assert all(rows[s]["async/version_lag_max"] <= 1 and "tis/clip_frac" in rows[s] for s in rows)


def test_the_tool_calling_agent_loop_runs_in_the_worker_as_it_runs_in_the_trainer(tmp_path):
    base = ("data.task=synthetic:peek", "train.max_steps=3", "checkpoint.every_steps=0", "eval.pass_k=0")
    train(small_config(tmp_path, *base), tmp_path / "sync")
    train(small_config(tmp_path, *base, "rollout.mode=async"), tmp_path / "async")
    sync_rows, async_rows = read_rows(tmp_path / "sync"), read_rows(tmp_path / "async")
    for step in sync_rows:  # multi-turn trajectories, their tool calls and rewards: the same
        mine = {k: v for k, v in comparable(async_rows[step]).items() if not k.startswith(ASYNC_ONLY)}
        assert mine == comparable(sync_rows[step]), step
        assert "tools/calls_per_traj" in mine


def test_an_interrupted_async_run_resumes_and_finishes(tmp_path, monkeypatch):
    import signal

    import tandemrl.train.loop as loop

    cfg = small_config(tmp_path, "train.max_steps=5", "rollout.mode=async", "rollout.max_staleness=1")
    real_step = loop.train_step

    def interrupted_step(run, state, display):
        if state.step == 2:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C during step 3: it finishes, saves, stops the worker
        return real_step(run, state, display)

    monkeypatch.setattr(loop, "train_step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run")
    monkeypatch.setattr(loop, "train_step", real_step)
    summary = train(cfg, tmp_path / "run", resume=True)
    rows = read_rows(tmp_path / "run")
    assert summary["steps"] == 5 and sorted(rows) == [1, 2, 3, 4, 5]
    assert [rows[s]["policy_version"] for s in rows] == [1, 2, 3, 4, 5]
    assert all(rows[s]["async/version_lag_max"] <= 1 for s in rows)
