"""Rollout backends: the RolloutBackend protocol and its implementations."""

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.hf_backend import HFBackend

__all__ = ["HFBackend", "RolloutBackend"]
