"""The reward: the weighted reward functions and the inference-aware terms."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from tandemrl.config.base import Section
from tandemrl.rewards.names import find_reward


class InferenceRewardConfig(Section):
    """Serving cost in the reward: total = task score - latency*ms - tokens*generated - kv_mb*MB held
    + accept*acceptance rate + cache_reuse*prefix-cache hit ratio. All 0 (the default) = plain GRPO. The
    inference_aware_grpo_training seed's values: 0.001, 0.001, 0.01, 1.0, 0.5."""

    latency: float = Field(0.0, ge=0.0, description="alpha: penalty per millisecond of request latency")
    tokens: float = Field(0.0, ge=0.0, description="beta: penalty per generated token")
    kv_mb: float = Field(0.0, ge=0.0, description="gamma: penalty per MB of KV cache the request held at its peak")
    accept: float = Field(0.0, ge=0.0, description="delta: bonus per unit of speculative acceptance rate")
    cache_reuse: float = Field(0.0, ge=0.0, description="epsilon: bonus per unit of prefix-cache hit ratio")


class RewardConfig(Section):
    """The reward: a weighted sum of reward functions (TRL's contract), plus the inference-aware terms."""

    functions: list[str] = Field(["accuracy"], description="reward functions: registered names (`accuracy`, "
                                 "`format`, `length_penalty`, `tool_use`, `tool_errors`), `package.module:function` "
                                 "or `path/to/file.py:function`; unset with `reward.weights` set: the keys of "
                                 "`reward.weights`")
    weights: dict[str, float] = Field({}, description="weight of each reward function by name: the entry of "
                                      "`reward.functions` or the short name the metrics show (`correct` for "
                                      "`rewards.py:correct`); 1.0 for a function not listed here")
    inference: InferenceRewardConfig = InferenceRewardConfig()

    def components(self) -> dict[str, float]:
        """name -> weight of every reward function the run calls (the names as ``reward.functions`` has them)."""
        weights = self._weights_by_function()
        return {name: weights.get(name, 1.0) for name in self.functions}

    def _weights_by_function(self) -> dict[str, float]:
        """``reward.weights`` keyed by the entry of ``reward.functions`` each key means (its full name or its
        short name); a key that names no function, a shared short name, or two keys for one function raise."""
        out: dict[str, float] = {}
        given: dict[str, str] = {}  # function -> the weights key that set it, for the error on a second one
        for key, weight in self.weights.items():
            function = find_reward(key, self.functions, "reward.weights")
            if function is None:
                raise ValueError(f"reward.weights names {key!r}, which is neither in reward.functions "
                                 f"({', '.join(self.functions)}) nor the short name of one: add it there or "
                                 "remove its weight")
            if function in given:
                raise ValueError(f"reward.weights gives {function!r} two weights ({given[function]!r} and {key!r}); "
                                 "keep one")
            out[function], given[function] = weight, key
        return out

    @model_validator(mode="before")
    @classmethod
    def _functions_from_weights(cls, data: Any) -> Any:
        """`reward.weights` alone names the functions too (`{accuracy = 1.0, format = 0.1}`)."""
        if isinstance(data, dict) and "functions" not in data and isinstance(data.get("weights"), dict):
            data = {**data, "functions": list(data["weights"])}
        return data

    @model_validator(mode="after")
    def _check_weights(self) -> RewardConfig:
        if not self.functions:
            raise ValueError("no reward function: set reward.functions (e.g. [\"accuracy\"])")
        self._weights_by_function()  # every weight names one function
        return self
