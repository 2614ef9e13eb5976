"""Group-relative advantage estimators, registered by name in ``ADVANTAGES``.

All estimators share one signature::

    fn(rewards: Tensor,   # [num_groups * group_size] float; consecutive group_size entries form a group
       valid: Tensor,     # same shape, bool; False where the reward is missing (None / error)
       group_size: int,
       eps: float = 1e-6,
    ) -> Tensor           # same shape and dtype as rewards

Invalid samples get advantage 0 and are excluded from their group's mean and std (their reward value is
never read, so it may be NaN). A group with fewer than 2 valid samples gets advantage 0 everywhere.

The std is the UNBIASED sample std (divisor n_valid - 1), the same as ``torch.std``'s default and TRL's
GRPO. Example: rewards [1, 0, 0, 1] in one group -> mean 0.5, std sqrt(1/3) = 0.5774, advantages
+-0.8660 (with eps=0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandemrl.algo.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


def _grouped(rewards: Tensor, valid: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Return (r [G,N] with invalid entries zeroed, w [G,N] float validity, n [G,1] valid counts, mean [G,1])."""
    if group_size <= 0:
        raise ValueError(f"group_size must be > 0, got {group_size}")
    if rewards.dim() != 1 or rewards.shape != valid.shape:
        raise ValueError(
            f"rewards and valid must be 1-D with the same shape, got {tuple(rewards.shape)} and {tuple(valid.shape)}"
        )
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if not rewards.is_floating_point():
        rewards = rewards.double()
    valid = valid.to(torch.bool)
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).view(-1, group_size)
    w = valid.view(-1, group_size).to(r.dtype)
    n = w.sum(dim=1, keepdim=True)
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    return r, w, n, mean


def _finish(centred: Tensor, w: Tensor, n: Tensor, shape: torch.Size) -> Tensor:
    keep = (w > 0) & (n >= 2)  # False for invalid samples and for groups with < 2 valid samples
    return torch.where(keep, centred, torch.zeros_like(centred)).reshape(shape)


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: Tensor, valid: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """(r - group mean) / (group unbiased std + eps), over the valid samples of each group."""
    r, w, n, mean = _grouped(rewards, valid, group_size)
    centred = (r - mean) * w
    var = (centred**2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
    denom = var.sqrt() + eps
    # denom is 0 only when eps == 0 and every valid reward in the group is equal: then centred is 0 too
    scaled = centred / torch.where(denom > 0, denom, torch.ones_like(denom))
    return _finish(scaled, w, n, rewards.shape)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, valid: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """r - group mean, no std division (Dr.GRPO, "Understanding R1-Zero-Like Training"). eps is unused."""
    del eps
    r, w, n, mean = _grouped(rewards, valid, group_size)
    return _finish((r - mean) * w, w, n, rewards.shape)
