"""One rollout batch: prompts x group_size completions, scored, with group-relative advantages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.backends.base import RolloutBackend
from tandemrl.config import RolloutConfig
from tandemrl.data.tasks import format_prompt, reward_columns
from tandemrl.rewards.composite import CompositeReward, RewardResult
from tandemrl.rewards.functions import REWARD_FUNCTIONS
from tandemrl.rollout.tools import ToolContext
from tandemrl.rollout.trajectory import TrajectorySpec
from tandemrl.types import Request, Rollout, Sample, SamplingParams, Trajectory


@dataclass
class PromptEncoder:
    """Turns task samples into prompt token ids, with or without the model's chat template."""

    tokenizer: object
    use_chat_template: bool
    system_prompt: str | None
    tools: list[dict[str, Any]] = field(default_factory=list)  # described through the chat template

    def encode(self, sample: Sample) -> tuple[str, list[int]]:
        text = format_prompt(sample, self.tokenizer, self.use_chat_template, self.system_prompt, self.tools)
        # A chat template already carries the special tokens it needs.
        ids = self.tokenizer(text, add_special_tokens=not self.use_chat_template)["input_ids"]
        return text, list(ids)


@dataclass
class ScoredRollouts:
    samples: list[Sample]  # aligned with rollouts: each prompt's sample repeated group_size times
    prompts: list[str]
    rollouts: list[Rollout]
    reward: RewardResult
    correct: list[bool]
    trajectories: list[Trajectory] | None = None  # multi-turn rollouts (tools); None for single-turn ones


def generate_and_score(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    params: SamplingParams,
    samples_per_prompt: int,
    policy_version: int,
    tag: str,
    tandem: bool = True,
    agent: Any = None,
) -> ScoredRollouts:
    """Sample ``samples_per_prompt`` completions per sample and score them; with ``agent`` (an AgentLoop) each is a
    multi-turn trajectory: rewards score its final turn, and get ``trajectory``, ``tool_calls``, ``tool_errors`` and
    ``tool_records`` columns."""
    expanded = [s for s in samples for _ in range(samples_per_prompt)]
    encoded = [encoder.encode(s) for s in samples]
    prompts = [text for text, _ in encoded for _ in range(samples_per_prompt)]
    columns = reward_columns(expanded)
    trajectories = None
    if agent is None:
        requests = [Request(f"{tag}-{i}-{j}", ids, params, tandem=tandem)
                    for i, (_, ids) in enumerate(encoded) for j in range(samples_per_prompt)]
        rollouts = backend.generate(requests, policy_version=policy_version)
        completions = [r.text for r in rollouts]
    else:
        trajectories = run_agent(backend, agent, samples, encoded, params, samples_per_prompt, policy_version, tag)
        rollouts = [t.rollout for t in trajectories]
        completions = [t.final_text for t in trajectories]  # the answer; the rest is in the columns below
        columns.update(trajectory_columns(trajectories))
    result = reward(prompts, completions, columns)
    accuracy = REWARD_FUNCTIONS["accuracy"](prompts, completions, **columns)
    correct = [a == 1.0 for a in accuracy]
    return ScoredRollouts(expanded, prompts, rollouts, result, correct, trajectories)


def run_agent(backend: RolloutBackend, agent: Any, samples: list[Sample], encoded: list[tuple[str, list[int]]],
              params: SamplingParams, samples_per_prompt: int, policy_version: int, tag: str) -> list[Trajectory]:
    """Multi-turn rollouts: each sample's prompt, ``samples_per_prompt`` trajectories, through the agent loop."""
    specs = [TrajectorySpec(f"{tag}-{i}-{j}", ids, params, ToolContext({"answer": s.answer, **s.columns}))
             for i, (s, (_, ids)) in enumerate(zip(samples, encoded)) for j in range(samples_per_prompt)]
    with backend.generating():  # type: ignore[attr-defined]  # build_agent checked it is the engine backend
        return agent.run(specs, policy_version)


def trajectory_columns(trajectories: list[Trajectory]) -> dict[str, list[Any]]:
    """What rewards see of each trajectory besides its final answer: the transcript, its tool calls and errors."""
    return {
        "trajectory": [t.rollout.text for t in trajectories],
        "tool_calls": [len(t.tool_calls) for t in trajectories],
        "tool_errors": [t.tool_errors for t in trajectories],
        "tool_records": [t.tool_calls for t in trajectories],
        "finish_reason": [t.rollout.finish_reason for t in trajectories],  # stop / length / max_* / error
    }


def group_advantages(scored: ScoredRollouts, group_size: int, estimator: str) -> tuple[Tensor, Tensor]:
    """Advantages [B] and a validity mask [B]; samples whose reward is None get advantage 0."""
    valid = torch.tensor([t is not None for t in scored.reward.total], dtype=torch.bool)
    rewards = torch.tensor([t if t is not None else 0.0 for t in scored.reward.total], dtype=torch.float32)
    return ADVANTAGES.get(estimator)(rewards, valid, group_size), valid


def rollout_params(cfg: RolloutConfig, seed: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
        stop=tuple(cfg.stop), ignore_eos=cfg.ignore_eos, seed=seed,
    )


def weigh_frozen_tokens(rollouts: list[Rollout], frozen_token_weight: float) -> None:
    """Tandem: the loss weight of each token from who wrote it (1.0 for the trained model, ``frozen_token_weight``
    for the frozen one); rollouts without writers are left as they are."""
    for r in rollouts:
        if r.token_sources:
            r.loss_weights = [1.0 if hot else frozen_token_weight for hot in r.token_sources]
