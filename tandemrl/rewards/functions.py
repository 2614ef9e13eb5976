"""Reward functions and their registry.

Every function follows TRL's contract: ``fn(prompts, completions, **columns) -> list[float | None]``, where the
columns (e.g. ``answer``) arrive as lists aligned with ``prompts``; every function accepts extra ``**kwargs``.
A completion may be a string or, in TRL's conversational form, a list of messages (the last one's content is used).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tandemrl.rewards.math import answers_match, boxed_span, extract_answer, parse_number
from tandemrl.rewards.names import INLINE_REWARD, short_name
from tandemrl.user_code import did_you_mean, inline_message, is_user_spec, load_callable

RewardFn = Callable[..., list]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}

LENGTH_PENALTY_CHARS = 1000


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name`` (usable in ``reward.weights``)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a reward name must be a non-empty string without ':', got {name!r}")

    def decorator(fn: RewardFn) -> RewardFn:
        existing = REWARD_FUNCTIONS.get(name)
        if existing is not None and existing.__qualname__ != fn.__qualname__:
            raise ValueError(f"reward {name!r} is already registered ({existing.__module__}.{existing.__qualname__})")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return decorator


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last message of a conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)) and completion:
        return completion_text(completion[-1])
    return "" if completion is None else str(completion)


def _column(kwargs: dict[str, Any], name: str, reward: str, n: int) -> list[Any]:
    if name not in kwargs or kwargs[name] is None:
        have = ", ".join(sorted(kwargs)) or "none"
        raise ValueError(f"reward {reward!r} needs an {name!r} column (columns given: {have})")
    values = list(kwargs[name])
    if len(values) != n:
        raise ValueError(f"reward {reward!r}: column {name!r} has {len(values)} values for {n} completions")
    return values


@register_reward("accuracy")
def accuracy(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the answer extracted from the completion (see ``extract_answer``) matches the ``answer`` column."""
    golds = _column(kwargs, "answer", "accuracy", len(completions))
    return [
        1.0 if answers_match(extract_answer(completion_text(c)), str(g)) else 0.0 for c, g in zip(completions, golds)
    ]


_TRAILING = re.compile(r"(?:\s|\*\*|\$|\\\]|\\\)|`|\.)+$")
_HASH_FINAL = re.compile(r"####[ \t]*([^\n#]*)$")


def has_final_answer(text: str, gold: str | None = None) -> bool:
    """True when ``text`` ends with a clearly marked numeric final answer.

    Accepted endings (trailing whitespace, ``.``, ``**``, ``$``, ``\\]``, ``\\)`` and backticks ignored):
    ``#### N`` on the last line; ``\\boxed{N}``; or a completion that is only a number (the synthetic tasks, whose
    completions are bare numbers). ``N`` must parse with ``parse_number`` ("#### 72", "\\boxed{\\frac{3}{4}}",
    "1,234"); "#### 72 clips" fails.

    A bare number must not have more digits than ``gold`` (when given): "222222" for a one-digit task is filler,
    not an answer (without this rule a tiny model earns the reward by printing digits up to the token limit).

    Any format reward can be earned by one constant output, and GRPO normalises rewards within each group, so even
    at weight 0.1 it can dominate accuracy and collapse a tiny model onto a constant answer. For randomly
    initialised models on the synthetic tasks use accuracy alone.
    """
    t = _TRAILING.sub("", text.strip())
    if not t:
        return False
    if parse_number(t) is not None:
        return gold is None or _digits(t) <= max(1, _digits(str(gold)))
    match = _HASH_FINAL.search(t)
    if match:
        return parse_number(match.group(1)) is not None
    span = boxed_span(t)
    return span is not None and span[1] == len(t) - 1 and parse_number(t[span[0] : span[1]]) is not None


def _digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


@register_reward("format")
def format_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion ends with a clearly marked final answer (see ``has_final_answer``), else 0.0.
    Uses the ``answer`` column when present (to bound the length of a bare-number completion)."""
    golds = kwargs.get("answer")
    if golds is None:
        golds = [None] * len(completions)
    elif len(golds) != len(completions):
        raise ValueError(f"reward 'format': column 'answer' has {len(golds)} values for {len(completions)} completions")
    return [1.0 if has_final_answer(completion_text(c), g) else 0.0 for c, g in zip(completions, golds)]


@register_reward("length_penalty")
def length_penalty(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """-(characters / 1000), floored at -1.0: a gentle push towards shorter completions."""
    return [-min(1.0, len(completion_text(c)) / LENGTH_PENALTY_CHARS) for c in completions]


@register_reward("tool_use")
def tool_use(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Multi-turn rollouts: 1.0 when the trajectory made at least one tool call that did not fail and then ended
    on its own (an answer, not a turn / call / token limit); needs the columns the agent loop adds."""
    n = len(completions)
    calls, errors = _column(kwargs, "tool_calls", "tool_use", n), _column(kwargs, "tool_errors", "tool_use", n)
    finished = _column(kwargs, "finish_reason", "tool_use", n)
    return [1.0 if c > e and f in ("stop", "length") else 0.0 for c, e, f in zip(calls, errors, finished)]


@register_reward("tool_errors")
def tool_error_penalty(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Multi-turn rollouts: minus the fraction of the trajectory's tool calls that failed (0 with no calls)."""
    calls = _column(kwargs, "tool_calls", "tool_errors", len(completions))
    errors = _column(kwargs, "tool_errors", "tool_errors", len(completions))
    return [-e / c if c else 0.0 for c, e in zip(calls, errors)]


def resolve_reward(name: str | RewardFn) -> RewardFn:
    """A registered reward name, ``"package.module:function"`` (imported; the working directory is searched too) or
    ``"path/to/file.py:function"`` (loaded from that file); a callable passes through. ``inline:<name>`` (how a run
    records a Python API callable) cannot be loaded: the error says how to pass the function again."""
    if callable(name):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a reward is named by a string, got {type(name).__name__}")
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    if name.startswith(INLINE_REWARD):
        raise ValueError(inline_message(name, short_name(name), "reward", "reward_funcs", "reward.functions",
                                        "and reward.weights, if the run weighted it"))
    if not is_user_spec(name):
        raise ValueError(
            f"unknown reward {name!r}{did_you_mean(name, REWARD_FUNCTIONS)}; registered rewards: "
            f"{', '.join(sorted(REWARD_FUNCTIONS))}, or give your own as 'package.module:function' or "
            "'path/to/file.py:function'"
        )
    return load_callable(name, "reward")
