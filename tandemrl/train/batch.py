"""Rollouts as training tensors: rows of left-padded prompts and right-padded completions.

The padded rows are the batch's storage (cheap: integers and per-token floats); the forward never computes on the
padding: train/packing.py concatenates each micro-batch's real tokens into one packed sequence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.types import Rollout


@dataclass
class TrainBatch:
    """Every row is prompt (left-padded to `prompt_width`) followed by completion (right-padded)."""

    input_ids: Tensor  # [B, P+T] long
    attention_mask: Tensor  # [B, P+T] long
    position_ids: Tensor  # [B, P+T] long
    completion_ids: Tensor  # [B, T] long
    loss_mask: Tensor  # [B, T] float: loss weight per completion token (Rollout.token_weights(); 0 on padding)
    advantages: Tensor  # [B] float
    policy_versions: Tensor  # [B] long: the weights that sampled each row
    prompt_width: int
    rollout_logprobs: Tensor | None = None  # [B, T], as the rollout backend sampled (0 on padding); None = unknown
    old_logprobs: Tensor | None = None  # [B, T], sampling policy; None = on-policy (use detached current)
    ref_logprobs: Tensor | None = None  # [B, T], frozen reference for the KL term

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def sequence_lengths(self) -> Tensor:
        """[B] long: prompt + completion tokens of each row (what a packed forward computes on)."""
        return self.attention_mask.sum(dim=1)

    def prompt_lengths(self) -> Tensor:
        """[B] long: prompt tokens of each row."""
        return self.attention_mask[:, : self.prompt_width].sum(dim=1)

    def policy_version_lag(self, trainer_version: int) -> int:
        """How many versions the trainer's weights are ahead of the oldest weights that sampled a row."""
        return trainer_version - int(self.policy_versions.min())

    def rows(self, index: Tensor | slice) -> TrainBatch:
        pick = (lambda t: None if t is None else t[index])
        return TrainBatch(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            position_ids=self.position_ids[index],
            completion_ids=self.completion_ids[index],
            loss_mask=self.loss_mask[index],
            advantages=self.advantages[index],
            policy_versions=self.policy_versions[index],
            prompt_width=self.prompt_width,
            rollout_logprobs=pick(self.rollout_logprobs),
            old_logprobs=pick(self.old_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
        )

    def narrow(self, prompt_width: int, completion_width: int) -> TrainBatch:
        """The last ``prompt_width`` prompt columns and the first ``completion_width`` completion columns: rows
        picked by ``rows()`` without the columns that are padding in all of them (prompts are left-padded,
        completions right-padded), so that a padded forward computes on no wider rows than its own."""
        start, end = self.prompt_width - prompt_width, self.prompt_width + completion_width
        per_token = (lambda t: None if t is None else t[:, :completion_width])
        return dataclasses.replace(
            self, input_ids=self.input_ids[:, start:end], attention_mask=self.attention_mask[:, start:end],
            position_ids=self.position_ids[:, start:end], completion_ids=per_token(self.completion_ids),
            loss_mask=per_token(self.loss_mask), prompt_width=prompt_width,
            rollout_logprobs=per_token(self.rollout_logprobs), old_logprobs=per_token(self.old_logprobs),
            ref_logprobs=per_token(self.ref_logprobs),
        )


def build_batch(rollouts: list[Rollout], advantages: Tensor, pad_id: int, device: torch.device) -> TrainBatch:
    prompt_width = max(len(r.prompt_ids) for r in rollouts)
    completion_width = max(1, max(len(r.completion_ids) for r in rollouts))
    rows, masks, targets, loss_masks = [], [], [], []
    for r in rollouts:
        left = prompt_width - len(r.prompt_ids)
        right = completion_width - len(r.completion_ids)
        rows.append([pad_id] * left + r.prompt_ids + r.completion_ids + [pad_id] * right)
        masks.append([0] * left + [1] * (len(r.prompt_ids) + len(r.completion_ids)) + [0] * right)
        targets.append(r.completion_ids + [pad_id] * right)
        loss_masks.append(r.token_weights() + [0.0] * right)
    attention_mask = torch.tensor(masks, dtype=torch.long, device=device)
    return TrainBatch(
        input_ids=torch.tensor(rows, dtype=torch.long, device=device),
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
        completion_ids=torch.tensor(targets, dtype=torch.long, device=device),
        loss_mask=torch.tensor(loss_masks, dtype=torch.float32, device=device),
        advantages=advantages.to(device=device, dtype=torch.float32),
        policy_versions=torch.tensor([r.policy_version for r in rollouts], dtype=torch.long, device=device),
        prompt_width=prompt_width,
        rollout_logprobs=_rollout_logprobs(rollouts, completion_width, device),
    )


def _rollout_logprobs(rollouts: list[Rollout], width: int, device: torch.device) -> Tensor | None:
    """[B, T] sampling log-probs, 0 on padding; None unless every rollout has one per completion token."""
    if any(len(r.logprobs) != len(r.completion_ids) for r in rollouts):
        return None  # a backend without log-probs: the mismatch metrics and TIS need them for every row
    rows = [list(r.logprobs) + [0.0] * (width - len(r.logprobs)) for r in rollouts]
    return torch.tensor(rows, dtype=torch.float32, device=device)
