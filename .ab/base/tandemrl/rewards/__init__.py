"""Rewards: math answer checking, registered reward functions, the composite (weighted) reward."""

from tandemrl.rewards.composite import CompositeReward, RewardResult, build_reward, metrics
from tandemrl.rewards.functions import REWARD_FUNCTIONS, register_reward, resolve_reward
from tandemrl.rewards.math import answers_match, extract_answer, parse_number

__all__ = [
    "REWARD_FUNCTIONS",
    "CompositeReward",
    "RewardResult",
    "answers_match",
    "build_reward",
    "extract_answer",
    "metrics",
    "parse_number",
    "register_reward",
    "resolve_reward",
]
