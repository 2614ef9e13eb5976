"""Rollouts as training tensors: rows of left-padded prompts and right-padded completions.

The padded rows are the batch's storage (cheap: integers and per-token floats); the forward never computes on the
padding: train/packing.py concatenates each micro-batch's real tokens into one packed sequence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
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
    prompts = _Ragged.of([r.prompt_ids for r in rollouts], left=True)
    completions = _Ragged.of([r.completion_ids for r in rollouts], min_width=1)  # a column even if all are empty
    completion_ids = completions.padded(pad_id, np.int64)
    attention_mask = torch.from_numpy(np.concatenate([prompts.real, completions.real], axis=1).astype(np.int64))
    loss_mask = completions.with_values([r.token_weights() for r in rollouts]).padded(0.0, np.float32)
    return TrainBatch(
        input_ids=_to(np.concatenate([prompts.padded(pad_id, np.int64), completion_ids], axis=1), device),
        attention_mask=attention_mask.to(device),
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0).to(device),
        completion_ids=_to(completion_ids, device),
        loss_mask=_to(loss_mask, device),
        advantages=advantages.to(device=device, dtype=torch.float32),
        policy_versions=torch.tensor([r.policy_version for r in rollouts], dtype=torch.long, device=device),
        prompt_width=prompts.width,
        rollout_logprobs=_rollout_logprobs(rollouts, completions, device),
    )


@dataclass
class _Ragged:
    """Rows of different lengths laid into a [rows, width] array in one vectorised copy (a batch of 256 long-tailed
    completions as nested Python lists cost ~0.2 s a step on the trainer's critical path). ``left``: padded on the
    left (prompts), else on the right (completions)."""

    rows: list[Sequence[float]]
    lengths: np.ndarray  # [rows] int64
    width: int
    left: bool = False

    @classmethod
    def of(cls, rows: list[Sequence[float]], left: bool = False, min_width: int = 0) -> _Ragged:
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        return cls(rows, lengths, max(min_width, int(lengths.max())), left)

    @property
    def real(self) -> np.ndarray:
        """[rows, width] bool: where the row's own values go (row-major order is the rows' concatenation order)."""
        columns = np.arange(self.width)
        edge = self.lengths[:, None]
        return columns >= self.width - edge if self.left else columns < edge

    def padded(self, fill: float, dtype: type) -> np.ndarray:
        out = np.full((len(self.rows), self.width), fill, dtype=dtype)
        out[self.real] = np.fromiter(chain.from_iterable(self.rows), dtype=dtype, count=int(self.lengths.sum()))
        return out

    def with_values(self, rows: list[Sequence[float]]) -> _Ragged:
        """Other rows of the same lengths (per-token values of these rows)."""
        return dataclasses.replace(self, rows=rows)


def _to(array: np.ndarray, device: torch.device) -> Tensor:
    return torch.from_numpy(array).to(device)


def _rollout_logprobs(rollouts: list[Rollout], completions: _Ragged, device: torch.device) -> Tensor | None:
    """[B, T] sampling log-probs, 0 on padding; None unless every rollout has one per completion token."""
    if any(len(r.logprobs) != len(r.completion_ids) for r in rollouts):
        return None  # a backend without log-probs: the mismatch metrics and TIS need them for every row
    return _to(completions.with_values([r.logprobs for r in rollouts]).padded(0.0, np.float32), device)
