"""One rollout batch: prompts x group_size completions, scored, with group-relative advantages."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.backends.base import RolloutBackend
from tandemrl.config import RolloutConfig
from tandemrl.data.tasks import format_prompt, reward_columns
from tandemrl.rewards.composite import CompositeReward, RewardResult
from tandemrl.rewards.functions import REWARD_FUNCTIONS
from tandemrl.types import Request, Rollout, Sample, SamplingParams


@dataclass
class PromptEncoder:
    """Turns task samples into prompt token ids, with or without the model's chat template."""

    tokenizer: object
    use_chat_template: bool
    system_prompt: str | None

    def encode(self, sample: Sample) -> tuple[str, list[int]]:
        text = format_prompt(sample, self.tokenizer, self.use_chat_template, self.system_prompt)
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


def generate_and_score(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    params: SamplingParams,
    samples_per_prompt: int,
    policy_version: int,
    tag: str,
) -> ScoredRollouts:
    expanded = [s for s in samples for _ in range(samples_per_prompt)]
    encoded = [encoder.encode(s) for s in samples]
    prompts = [text for text, _ in encoded for _ in range(samples_per_prompt)]
    requests = [
        Request(f"{tag}-{i}-{j}", ids, params) for i, (_, ids) in enumerate(encoded) for j in range(samples_per_prompt)
    ]
    rollouts = backend.generate(requests, policy_version=policy_version)
    completions = [r.text for r in rollouts]
    columns = reward_columns(expanded)
    result = reward(prompts, completions, columns)
    accuracy = REWARD_FUNCTIONS["accuracy"](prompts, completions, **columns)
    correct = [a == 1.0 for a in accuracy]
    return ScoredRollouts(expanded, prompts, rollouts, result, correct)


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
