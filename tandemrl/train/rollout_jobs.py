"""One step's rollout batch as a job: drawn on the trainer's thread, sampled and scored wherever it runs.

The synchronous step runs its job at once on the run's backend; the asynchronous loop hands jobs to the rollout
worker ahead of time. Both draw the same prompts and seeds for the same step index, so the two modes sample the
same batch when the weights are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tandemrl.backends.base import RolloutBackend
from tandemrl.rewards.state import RewardTrainerState
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.train.rollouts import RolloutBatch, ScoredRollouts, generate_and_score, rollout_params
from tandemrl.train.setup import Run
from tandemrl.types import Request, Rollout, Sample, SamplingParams


@dataclass
class RolloutJob:
    index: int  # the step whose batch this is: it names the requests and seeds the sampling
    samples: list[Sample]
    group_sizes: int | Sequence[int]
    params: SamplingParams
    trainer_state: RewardTrainerState  # what the rewards get as `trainer_state`: the run as this batch was drawn


def draw_job(run: Run, index: int) -> RolloutJob:
    """The next prompts (torchrun: this rank's whole groups) and their group sizes (the curriculum's, else
    rollout.group_size), on the trainer's thread: the data iterator and the curriculum are the trainer's."""
    cfg = run.cfg
    # taken here, on the trainer's thread: the async worker scores the batch later, while the trainer moves on
    trainer_state = RewardTrainerState(global_step=index, max_steps=cfg.train.max_steps,
                                       epoch=run.train_prompts.progress)
    samples = run.parallel.local_share(run.train_prompts.next_batch())
    group_sizes = [run.curriculum.rollouts_for(s.index) for s in samples] if run.curriculum else cfg.rollout.group_size
    params = rollout_params(cfg.rollout, seed=run.parallel.rollout_seed(cfg.train.seed * 1_000_003 + index))
    return RolloutJob(index, samples, group_sizes, params, trainer_state)


def run_job(run: Run, job: RolloutJob, backend: RolloutBackend, agent: AgentLoop | None,
            policy_version: int) -> ScoredRollouts:
    return generate_and_score(backend, run.encoder, job.samples, run.reward, job.params, job.group_sizes,
                              policy_version, f"step{job.index}", trainer_state=job.trainer_state, agent=agent,
                              inference=run.inference)


def prepare_job(run: Run, job: RolloutJob) -> tuple[list[Request], Callable[[list[Rollout]], ScoredRollouts]]:
    """``run_job`` in two halves, for a worker that runs the engine itself: the job's requests, and the function
    that scores their rollouts (in request order)."""
    batch = RolloutBatch.encode(run.encoder, job.samples, job.group_sizes)
    return batch.requests(job.params, f"step{job.index}"), lambda rollouts: batch.score(
        rollouts, run.reward, job.trainer_state, run.inference)
