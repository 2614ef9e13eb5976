"""Pack rollouts into padded training tensors: left-padded prompts, right-padded completions."""

from __future__ import annotations

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
    loss_mask: Tensor  # [B, T] float: loss weight per completion token (0 on padding)
    advantages: Tensor  # [B] float
    prompt_width: int
    old_logprobs: Tensor | None = None  # [B, T], sampling policy; None = on-policy (use detached current)
    ref_logprobs: Tensor | None = None  # [B, T], frozen reference for the KL term

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: Tensor | slice) -> TrainBatch:
        pick = (lambda t: None if t is None else t[index])
        return TrainBatch(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            position_ids=self.position_ids[index],
            completion_ids=self.completion_ids[index],
            loss_mask=self.loss_mask[index],
            advantages=self.advantages[index],
            prompt_width=self.prompt_width,
            old_logprobs=pick(self.old_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
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
        loss_masks.append([1.0] * len(r.completion_ids) + [0.0] * right)
    attention_mask = torch.tensor(masks, dtype=torch.long, device=device)
    return TrainBatch(
        input_ids=torch.tensor(rows, dtype=torch.long, device=device),
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
        completion_ids=torch.tensor(targets, dtype=torch.long, device=device),
        loss_mask=torch.tensor(loss_masks, dtype=torch.float32, device=device),
        advantages=advantages.to(device=device, dtype=torch.float32),
        prompt_width=prompt_width,
    )
