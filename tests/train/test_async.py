"""rollout.mode = "async": the rollout worker, its queue, staleness, and runs against the synchronous loop (CPU)."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tandemrl.config import ConfigError, load_config
from tandemrl.rewards.composite import RewardResult
from tandemrl.rewards.state import RewardTrainerState
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


def empty_job(index: int) -> RolloutJob:
    return RolloutJob(index, [], 2, SamplingParams(), RewardTrainerState())


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
    return AsyncRollouts(empty_job, worker, max_staleness, groups_per_step=1, first_index=0), trainer, seen


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
    assert all("tis/weight_mean" in rows[s] and rows[s]["async/worker_pause_s"] >= 0 for s in rows)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    for row in samples:  # each rollout names the weights that sampled it: at most one update behind its step
        assert row["step"] - 2 <= row["policy_version"] <= row["policy_version_last"] <= row["step"] - 1


def test_a_worker_that_dies_stops_the_run_with_its_error(tmp_path, monkeypatch):
    import tandemrl.train.async_rollouts as async_rollouts

    real = async_rollouts.prepare_job

    def failing(run, job):
        if job.index == 2:
            raise RuntimeError("the rollout GPU fell off the bus")
        return real(run, job)

    monkeypatch.setattr(async_rollouts, "prepare_job", failing)
    with pytest.raises(RolloutProducerError, match="while sampling step 2's batch.*fell off the bus"):
        train(small_config(tmp_path, "rollout.mode=async"), tmp_path / "run")
    assert read_rows(tmp_path / "run").keys() == {1, 2}


def test_the_batch_worker_that_dies_stops_the_take_with_its_error():
    """The worker of the agent loop and of a server (a batch at a time), as the stepping worker above."""

    def sample(job: RolloutJob, version: int) -> ScoredRollouts:
        if job.index == 1:
            raise ConnectionError("the rollout server went away")
        return scored_group(job.index, 0)  # as a server's version, which the worker does not know (-1)

    worker = RolloutWorker(sample, None, RolloutQueue(capacity_groups=4))
    source = AsyncRollouts(empty_job, worker, 0, 1, first_index=0)
    try:
        assert source.next(step=0, trainer_version=0)[0].rollouts[0].request_id == "s0-0"
        with pytest.raises(RolloutProducerError, match="while sampling step 1's batch.*server went away"):
            source.next(step=1, trainer_version=0)
    finally:
        source.close()


def test_a_worker_thread_that_ends_without_a_word_stops_the_take():
    """A thread gone without putting its error (killed, or a bug past the handler) is noticed while waiting."""
    from tandemrl.train.job_thread import JobThread

    class Vanishing(JobThread):
        def _run(self) -> None:
            return None  # ends at once, nothing on the queue

    source = AsyncRollouts(empty_job, Vanishing(None, RolloutQueue(capacity_groups=4)), 0, 1, first_index=0)
    with pytest.raises(RolloutProducerError, match="the rollout worker thread ended"):
        source.next(step=0, trainer_version=0)


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


# ------------------------------------------------------------------ pushes between engine steps, per-token versions


def test_a_push_reaches_the_running_engine_between_two_steps_and_splits_its_rollouts():
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.config import EngineConfig
    from tandemrl.train.async_rollouts import follow_pushes
    from tandemrl.types import Request
    from tests.engine.test_model_runner import build

    def run(push: bool) -> tuple[list[Rollout], dict[str, int]]:
        trainer = build("qwen2", seed=0)
        mirror = weight_mirror.WeightMirror.copy_of(trainer, torch.device("cpu"), version=0)
        engine = EngineBackend(mirror.target, None, EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False,
                                                              decode_steps=2)).engine
        follow_pushes(engine, mirror)
        params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        for i in range(2):
            engine.add_request(Request(f"r{i}", [5 + i, 9, 13, 2, 7], params))
        with torch.no_grad():
            done = engine.step() + engine.step() + engine.step()  # a prefill and decode steps under version 0
            launched = {s.request_id: s.num_completion_tokens for s in engine.scheduler.running}  # pending too
            if push:  # the trainer's update: other weights, published while the batch runs
                trainer.load_state_dict(build("qwen2", seed=1).state_dict())
                mirror.publish(1)
            while engine.has_unfinished():
                done += engine.step()
        if push:
            assert all(torch.equal(p, q) for p, q in zip(trainer.parameters(), mirror.target.parameters()))
        return sorted(done, key=lambda r: r.request_id), launched

    pushed, launched = run(push=True)
    unpushed, _ = run(push=False)
    for r, ref in zip(pushed, unpushed):
        k = launched[r.request_id]
        assert 0 < k < 10
        assert r.token_versions() == [0] * k + [1] * (10 - k) and r.policy_version == 0
        assert ref.version_runs == [] and ref.token_versions() == [0] * 10
        assert r.completion_ids[:k] == ref.completion_ids[:k]  # sampled before the push: the same tokens
    assert any(r.completion_ids != ref.completion_ids for r, ref in zip(pushed, unpushed))  # the push took effect


def test_a_group_is_as_stale_as_its_oldest_token_on_the_queue_and_on_the_wire():
    from tandemrl.train.group_wire import GroupFormatError, group_from_json, group_to_json
    from tandemrl.train.rollout_queue import oldest_version

    spanning = scored_group(0, 1, size=2)
    for r in spanning.rollouts:
        r.completion_ids, r.logprobs = [3, 4, 5], [-0.5] * 3
    spanning.rollouts[1].version_runs = [(0, 1), (2, 2)]  # tokens 0-1 by version 1, token 2 by version 2
    fresh = scored_group(1, 2)
    assert oldest_version(spanning) == 1 and oldest_version(fresh) == 2
    wired = group_from_json(group_to_json(spanning, "env"))  # the runs travel with the group
    assert [r.token_versions() for r in wired.rollouts] == [[1, 1, 1], [1, 1, 2]]
    assert oldest_version(wired) == 1
    body = group_to_json(spanning, "env")
    body["completions"][1]["version_runs"] = [[1, 2]]
    with pytest.raises(GroupFormatError, match="version_runs"):
        group_from_json(body)
    q = RolloutQueue(capacity_groups=4)
    for scored in (wired, fresh):
        q.put(QueuedGroups(scored, oldest_version(scored)))
    taken = q.take(1, trainer_version=3, max_staleness=1)  # the spanning group's newest token is 1 behind: dropped
    assert taken.dropped_groups == 1 and [p.version for p in taken.parts] == [2]


def test_the_stepping_worker_runs_the_next_batch_beside_the_last_and_a_push_splits_its_rollouts():
    """Job 1 joins the engine while job 0 runs; the trainer's update lands when job 0 is scored, so job 1's
    rollouts continue under the new weights: their tokens span two versions and the group is as old as the first."""
    import threading

    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.config import EngineConfig
    from tandemrl.train.async_rollouts import follow_pushes
    from tandemrl.train.stepping_worker import SteppingWorker
    from tandemrl.types import Request
    from tests.engine.test_model_runner import build

    trainer = build("qwen2", seed=0)
    mirror = weight_mirror.WeightMirror.copy_of(trainer, torch.device("cpu"), version=0)
    backend = EngineBackend(mirror.target, None, EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False,
                                                              decode_steps=2))
    follow_pushes(backend.engine, mirror)
    both_submitted, admitted = threading.Event(), []

    def prepare(job: RolloutJob):
        if job.index == 0:
            assert both_submitted.wait(10)
        admitted.append((job.index, [j.job.index for j in worker._open]))  # the jobs already running
        params = SamplingParams(max_tokens=4 if job.index == 0 else 16, temperature=0.0, ignore_eos=True)
        requests = [Request(f"step{job.index}-{i}", [5 + i, 9, 13, 2], params) for i in range(2)]

        def score(rollouts: list[Rollout]) -> ScoredRollouts:
            if job.index == 0:  # the trainer's update, published while job 1 runs
                trainer.load_state_dict(build("qwen2", seed=1).state_dict())
                mirror.publish(1)
            group = scored_group(job.index, 0)
            group.rollouts = rollouts
            return group

        return requests, score

    worker = SteppingWorker(prepare, backend.generating, mirror, RolloutQueue(capacity_groups=8))
    try:
        worker.submit(empty_job(0))
        worker.submit(empty_job(1))
        both_submitted.set()
        taken = worker.out.take(2, trainer_version=1, max_staleness=1, timeout=120)
    finally:
        worker.stop()
    assert admitted == [(0, []), (1, [0])]  # job 1 joined while job 0 ran
    first, second = taken.parts
    assert (first.version, second.version) == (0, 0)  # job 1 is as old as its oldest token
    assert all(r.token_versions() == [0] * 4 for r in first.scored.rollouts)
    for r in second.scored.rollouts:
        versions = r.token_versions()
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions), versions
        assert r.policy_version == 0
    q = RolloutQueue(capacity_groups=8)
    q.put(second)
    q.put(QueuedGroups(scored_group(2, 1), 1))
    kept = q.take(1, trainer_version=1, max_staleness=0)  # its newest tokens are current, its oldest are not
    assert kept.dropped_groups == 1 and [p.version for p in kept.parts] == [1]


def test_the_trainers_engine_sleeps_through_async_updates_and_wakes_for_evaluations(tmp_path, monkeypatch):
    """Async: the worker samples, so the trainer's engine holds no cache while it updates; evaluations still run."""
    import tandemrl.train.loop as loop
    runs, asleep = [], {"batch": [], "update": [], "eval": []}
    build_run, build_batch, policy_update, evaluate = (loop.build_run, loop.build_batch, loop.policy_update,
                                                       loop.evaluate)
    monkeypatch.setattr(loop, "build_run", lambda *a, **k: runs.append(build_run(*a, **k)) or runs[-1])

    def batch(*args, **kwargs):  # a step's start: no wake since the last update
        asleep["batch"].append(runs[0].backend.engine.is_asleep)
        return build_batch(*args, **kwargs)

    def update(*args, **kwargs):
        asleep["update"].append(runs[0].backend.engine.is_asleep)
        return policy_update(*args, **kwargs)

    def evaluation(backend, *args, **kwargs):
        asleep["eval"].append(backend.engine.is_asleep)
        return evaluate(backend, *args, **kwargs)

    monkeypatch.setattr(loop, "build_batch", batch)
    monkeypatch.setattr(loop, "policy_update", update)
    monkeypatch.setattr(loop, "evaluate", evaluation)
    summary = train(small_config(tmp_path, "train.max_steps=4", "checkpoint.every_steps=0", "eval.every_steps=2",
                                 "rollout.mode=async", "rollout.max_staleness=1"), tmp_path / "run")
    assert asleep == {"batch": [True] * 4, "update": [True] * 4, "eval": [False] * 3}  # evals: initial, step 2, final
    assert summary["steps"] == 4 and runs[0].backend.engine.is_asleep


def test_the_worker_busy_share_counts_a_busy_period_in_the_windows_it_spans():
    """A batch sampled across two takes is split between their windows: no window reads more than all busy."""
    import threading
    import time

    from tandemrl.train.job_thread import JobThread

    release = threading.Event()

    class OneLongBatch(JobThread):
        def _run(self) -> None:
            self._busy(True)
            release.wait(timeout=10)
            self._busy(False)

    worker = OneLongBatch(None, RolloutQueue(capacity_groups=4))
    source = AsyncRollouts(empty_job, worker, 0, 1, first_index=0)
    shares = []
    for _ in range(2):
        time.sleep(0.05)
        shares.append(source._worker_busy())
    release.set()
    time.sleep(0.05)
    shares.append(source._worker_busy())
    assert all(0.0 <= share <= 1.0 for share in shares), shares
    assert shares[0] > 0.5 and shares[1] > 0.5  # busy all along, counted while it runs
    assert shares[2] < 1.0
    worker.stop()
