"""GRPO-family algorithms as pure functions, each chosen by name from a registry."""

from tandemrl.algo.advantages import ADVANTAGES, dr_grpo_advantages, grpo_advantages
from tandemrl.algo.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    BatchNorm,
    LossConfig,
    LossInputs,
    LossOutput,
    grpo_loss,
    k3_kl,
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
    "dr_grpo_advantages",
    "grpo_advantages",
    "grpo_loss",
    "k3_kl",
]
