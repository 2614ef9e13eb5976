"""GRPO-family algorithms as pure functions, each chosen by name from a registry."""

from tandemrl.algo.advantages import ADVANTAGES, dr_grpo_advantages, grpo_advantages
from tandemrl.algo.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    BatchNorm,
    LossConfig,
    LossInputs,
    LossOutput,
    accumulate_metrics,
    grpo_loss,
    is_maximum,
    k3_kl,
    rollout_metrics,
    tis_weights,
)
from tandemrl.algo.registry import Registry, UnknownNameError

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "BatchNorm",
    "LossConfig",
    "LossInputs",
    "LossOutput",
    "Registry",
    "UnknownNameError",
    "accumulate_metrics",
    "dr_grpo_advantages",
    "grpo_advantages",
    "grpo_loss",
    "is_maximum",
    "k3_kl",
    "rollout_metrics",
    "tis_weights",
]
