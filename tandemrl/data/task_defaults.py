"""Config defaults a task brings with it: the keys it needs to be learnable as ``--set data.task=NAME`` alone.

Each entry maps dotted config keys to values. ``with_task_defaults`` fills a key in only when the user's TOML file
and ``--set`` overrides leave it out, so an explicit setting always wins; the resolved values are ordinary config
values and appear in the run's ``config.toml`` (and in ``tandemrl config``).
"""

from __future__ import annotations

import copy
from typing import Any

# synthetic:peek: the hidden digit is only reachable through the `peek` tool. The call is the one token "?" (a tiny
# model finds it by chance and GRPO reinforces it), the result "=7" ends where the answer starts, one call is all
# the task needs, and a one-token turn keeps the answer a single digit. `tool_use` shapes the reward: without it
# the model rarely finds the call before it settles on guessing (10 % accuracy).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "synthetic:peek": {
        "tools.names": ["peek"],
        "tools.format": "plain",
        "tools.call_open": "?",
        "tools.call_close": "",
        "tools.result_open": "=",
        "tools.result_close": "",
        "tools.max_tool_calls": 1,
        "rollout.max_tokens": 1,
        "reward.weights": {"accuracy": 1.0, "tool_use": 0.5},
        "train.max_steps": 250,
    },
}


def with_task_defaults(raw: dict[str, Any], task: Any) -> dict[str, Any]:
    """``raw`` (the user's TOML and overrides, not yet validated) plus ``task``'s defaults for the keys it lacks."""
    defaults = TASK_DEFAULTS.get(task) if isinstance(task, str) else None
    if not defaults:
        return raw
    merged = copy.deepcopy(raw)
    for key, value in defaults.items():
        *sections, name = key.split(".")
        node = merged
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):  # a malformed value: validation names it
                break
        else:
            node.setdefault(name, copy.deepcopy(value))
    return merged
