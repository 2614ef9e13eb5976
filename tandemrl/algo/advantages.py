"""Group-relative advantage estimators, registered by name in ``ADVANTAGES``.

All estimators share one signature::

    fn(rewards: Tensor,          # [B] float
       valid: Tensor,            # [B] bool; False where the reward is missing (None / error)
       group_size: int | None,   # equal groups: consecutive group_size entries form a group
       eps: float = 1e-6,
       *, group_ids: Tensor | None = None,  # [B] int: the prompt each sample belongs to (groups of any size)
    ) -> Tensor                  # same shape and dtype as rewards

Give exactly one of ``group_size`` and ``group_ids``. With ``group_ids`` groups may have different sizes (the
adaptive curriculum gives harder prompts more samples): every statistic is taken within each prompt's group, so
a group gets the same advantages as it would alone.

Invalid samples get advantage 0 and are excluded from their group's mean and std (their reward value is
never read, so it may be NaN). A group with fewer than 2 valid samples gets advantage 0 everywhere.

The std is the UNBIASED sample std (divisor n_valid - 1), the same as ``torch.std``'s default and TRL's
GRPO. Example: rewards [1, 0, 0, 1] in one group -> mean 0.5, std sqrt(1/3) = 0.5774, advantages
+-0.8660 (with eps=0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.algo.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


@dataclass
class _Groups:
    r: Tensor  # [B] rewards, invalid entries zeroed
    w: Tensor  # [B] float validity
    index: Tensor  # [B] long, 0..G-1: each sample's group
    n: Tensor  # [G] valid samples per group
    mean: Tensor  # [G] mean valid reward per group

    def sum(self, values: Tensor) -> Tensor:
        """Per-group sums [G] of per-sample values [B]."""
        return torch.zeros_like(self.n).index_add_(0, self.index, values)


def _group_index(n: int, group_size: int | None, group_ids: Tensor | None, device: torch.device) -> Tensor:
    if (group_size is None) == (group_ids is None):
        raise ValueError("give exactly one of group_size (equal groups) and group_ids (one id per sample)")
    if group_ids is not None:
        if group_ids.shape != (n,):
            raise ValueError(f"group_ids must have one id per reward ({n}), got shape {tuple(group_ids.shape)}")
        return torch.unique(group_ids.to(device), return_inverse=True)[1]
    if group_size <= 0:
        raise ValueError(f"group_size must be > 0, got {group_size}")
    if n % group_size:
        raise ValueError(f"{n} rewards do not split into groups of {group_size}")
    return torch.arange(n, device=device) // group_size


def _grouped(rewards: Tensor, valid: Tensor, group_size: int | None, group_ids: Tensor | None) -> _Groups:
    if rewards.dim() != 1 or rewards.shape != valid.shape:
        raise ValueError(
            f"rewards and valid must be 1-D with the same shape, got {tuple(rewards.shape)} and {tuple(valid.shape)}"
        )
    index = _group_index(rewards.numel(), group_size, group_ids, rewards.device)
    if not rewards.is_floating_point():
        rewards = rewards.double()
    valid = valid.to(torch.bool)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    w = valid.to(r.dtype)
    groups = int(index.max()) + 1 if index.numel() else 0
    n = torch.zeros(groups, dtype=r.dtype, device=r.device).index_add_(0, index, w)
    mean = torch.zeros_like(n).index_add_(0, index, r) / n.clamp(min=1)
    return _Groups(r, w, index, n, mean)


def _finish(values: Tensor, g: _Groups) -> Tensor:
    keep = (g.w > 0) & (g.n[g.index] >= 2)  # False for invalid samples and for groups with < 2 valid samples
    return torch.where(keep, values, torch.zeros_like(values))


def _safe_divide(values: Tensor, denom: Tensor) -> Tensor:
    # denom is 0 only when eps == 0 and every valid reward is equal: then values are 0 too
    return values / torch.where(denom > 0, denom, torch.ones_like(denom))


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: Tensor, valid: Tensor, group_size: int | None = None, eps: float = 1e-6, *,
                    group_ids: Tensor | None = None) -> Tensor:
    """(r - group mean) / (group unbiased std + eps), over the valid samples of each group."""
    g = _grouped(rewards, valid, group_size, group_ids)
    centred = (g.r - g.mean[g.index]) * g.w
    var = g.sum(centred**2) / (g.n - 1).clamp(min=1)
    return _finish(_safe_divide(centred, var.sqrt()[g.index] + eps), g)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, valid: Tensor, group_size: int | None = None, eps: float = 1e-6, *,
                       group_ids: Tensor | None = None) -> Tensor:
    """r - group mean, no std division (Dr.GRPO, "Understanding R1-Zero-Like Training"). eps is unused."""
    del eps
    g = _grouped(rewards, valid, group_size, group_ids)
    return _finish((g.r - g.mean[g.index]) * g.w, g)


@ADVANTAGES.register("step_norm")
def step_norm_advantages(rewards: Tensor, valid: Tensor, group_size: int | None = None, eps: float = 1e-6, *,
                         group_ids: Tensor | None = None) -> Tensor:
    """(r - step mean) / (step unbiased std + eps) over every valid sample of the step, groups ignored: the
    whole-step normalisation of the inference_aware_grpo_training seed, kept as an option. Groups still decide
    nothing here; their arguments are only checked."""
    _grouped(rewards, valid, group_size, group_ids)
    valid = valid.to(torch.bool)
    r = rewards if rewards.is_floating_point() else rewards.double()
    n = int(valid.sum())
    if n < 2:
        return torch.zeros_like(r)
    kept = r[valid]
    centred = torch.where(valid, r - kept.mean(), torch.zeros_like(r))
    return _safe_divide(centred, kept.std() + eps)
