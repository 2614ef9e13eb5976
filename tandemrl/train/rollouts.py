"""One rollout batch: prompts x group_size completions, scored, with group-relative advantages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.backends.base import RolloutBackend
from tandemrl.config import RolloutConfig
from tandemrl.data.tasks import format_prompt, reward_columns
from tandemrl.rewards.composite import CompositeReward, RewardResult
from tandemrl.rewards.functions import REWARD_FUNCTIONS
from tandemrl.rewards.inference import InferenceReward
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
    samples: list[Sample]  # aligned with rollouts: each prompt's sample repeated once per rollout of it
    prompts: list[str]
    rollouts: list[Rollout]
    reward: RewardResult
    correct: list[bool]
    group_ids: list[int]  # the position of each rollout's prompt in the batch: its GRPO group


def generate_and_score(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    params: SamplingParams,
    samples_per_prompt: int | Sequence[int],
    policy_version: int,
    tag: str,
    tandem: bool = True,
    inference: InferenceReward | None = None,
) -> ScoredRollouts:
    """``samples_per_prompt``: one count for every prompt, or one per prompt (the curriculum's). ``inference``:
    add the serving-cost terms of reward.inference to the reward (training; evaluation scores the task alone)."""
    counts = _counts(samples_per_prompt, len(samples))
    group_ids = [i for i, n in enumerate(counts) for _ in range(n)]
    expanded = [samples[i] for i in group_ids]
    encoded = [encoder.encode(s) for s in samples]
    prompts = [encoded[i][0] for i in group_ids]
    requests = [Request(f"{tag}-{i}-{j}", encoded[i][1], params, tandem=tandem)
                for i, n in enumerate(counts) for j in range(n)]
    rollouts = backend.generate(requests, policy_version=policy_version)
    completions = [r.text for r in rollouts]
    columns = reward_columns(expanded)
    result = reward(prompts, completions, columns)
    if inference is not None:
        result = inference(result, rollouts)
    accuracy = REWARD_FUNCTIONS["accuracy"](prompts, completions, **columns)
    correct = [a == 1.0 for a in accuracy]
    return ScoredRollouts(expanded, prompts, rollouts, result, correct, group_ids)


def _counts(samples_per_prompt: int | Sequence[int], prompts: int) -> list[int]:
    counts = [samples_per_prompt] * prompts if isinstance(samples_per_prompt, int) else list(samples_per_prompt)
    if len(counts) != prompts or any(n < 1 for n in counts):
        raise ValueError(f"samples per prompt must be >= 1 for each of the {prompts} prompts, got {counts}")
    return counts


def group_advantages(scored: ScoredRollouts, estimator: str) -> tuple[Tensor, Tensor]:
    """Advantages [B] within each prompt's group (groups may differ in size) and a validity mask [B]; samples
    whose reward is None get advantage 0."""
    valid = torch.tensor([t is not None for t in scored.reward.total], dtype=torch.bool)
    rewards = torch.tensor([t if t is not None else 0.0 for t in scored.reward.total], dtype=torch.float32)
    group_ids = torch.tensor(scored.group_ids, dtype=torch.long)
    return ADVANTAGES.get(estimator)(rewards, valid, group_ids=group_ids), valid


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
