"""Rollout backends: the RolloutBackend protocol and its implementations."""

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.hf_backend import HFBackend
from tandemrl.backends.sampler import sample_tokens

__all__ = ["HFBackend", "RolloutBackend", "sample_tokens"]
