"""A scored GRPO group as JSON: what an environment process pushes to the trainer (``POST /groups``).

```json
{"env": "gsm8k-0", "prompt": "What is 2+3?", "prompt_ids": [...], "answer": "5", "index": 17,
 "completions": [{"token_ids": [...], "logprobs": [...], "loss_weights": [...], "policy_version": 4,
                  "finish_reason": "stop", "text": "5"}, ...],
 "rewards": [1.0, 0.0, ...], "components": {"accuracy": [1.0, 0.0, ...]}, "correct": [true, false, ...]}
```

``logprobs``: the sampling log-prob of each completion token (the off-policy correction needs them);
``loss_weights`` (optional, 1.0 each when absent): the token's weight in the loss, 0 for tokens the model did not
write (tool output); ``policy_version``: the weights that sampled the completion (the server's ``policy_version``);
``version_runs`` (optional): where the weights changed while the completion ran, ``[[first token index, version],
...]`` from index 0 in order (``policy_version`` is then the first run's); the trainer drops a group by its oldest
token's version. ``rewards``: the total per completion (null: no reward, left out of the update); ``components``
(optional): each reward function's values; ``correct`` (optional): the task's accuracy per completion.
"""

from __future__ import annotations

from typing import Any

from tandemrl.rewards.composite import RewardResult
from tandemrl.train.rollouts import ScoredRollouts
from tandemrl.types import Rollout, Sample


class GroupFormatError(ValueError):
    """A pushed group is malformed; the message names the field."""


def group_to_json(scored: ScoredRollouts, env: str) -> dict[str, Any]:
    """One group (every rollout of one prompt) as the wire format."""
    if len(set(scored.group_ids)) != 1:
        raise ValueError(f"one group at a time: got {len(set(scored.group_ids))}")
    sample = scored.samples[0]
    return {
        "env": env, "prompt": scored.prompts[0], "prompt_ids": list(scored.rollouts[0].prompt_ids),
        "answer": sample.answer, "index": sample.index,
        "completions": [{"token_ids": r.completion_ids, "logprobs": r.logprobs, "loss_weights": r.loss_weights,
                         "policy_version": r.policy_version, "finish_reason": r.finish_reason, "text": r.text,
                         **({"version_runs": [list(run) for run in r.version_runs]} if r.version_runs else {})}
                        for r in scored.rollouts],
        "rewards": scored.reward.total, "components": scored.reward.components, "correct": scored.correct,
    }


def group_from_json(body: Any) -> ScoredRollouts:
    """The trainer's side: a pushed group, checked field by field."""
    if not isinstance(body, dict):
        raise GroupFormatError("a group is a JSON object")
    prompt_ids = _int_list(body.get("prompt_ids"), "prompt_ids")
    completions = body.get("completions")
    if not isinstance(completions, list) or len(completions) < 2:
        raise GroupFormatError("completions: a list of at least 2 completions (a GRPO group)")
    n = len(completions)
    rollouts = [_rollout(c, i, prompt_ids, str(body.get("env", "env"))) for i, c in enumerate(completions)]
    rewards = _values(body.get("rewards"), n, "rewards")
    components = body.get("components") or {"reward": rewards}
    if not isinstance(components, dict):
        raise GroupFormatError("components: an object of reward name -> one value per completion")
    components = {str(name): _values(v, n, f"components.{name}") for name, v in components.items()}
    correct = body.get("correct")
    if correct is not None and (not isinstance(correct, list) or len(correct) != n):
        raise GroupFormatError(f"correct: one boolean per completion ({n})")
    prompt = body.get("prompt", "")
    sample = Sample(prompt=prompt if isinstance(prompt, str) else str(prompt), answer=body.get("answer"),
                    index=int(body.get("index", 0) or 0), source=str(body.get("env", "")))
    reward = RewardResult(total=rewards, components=components, errors={}, first_traceback=None, nonfinite=0)
    return ScoredRollouts([sample] * n, [sample.prompt] * n, rollouts, reward,
                          None if correct is None else [bool(c) for c in correct], [0] * n)


def _rollout(c: Any, i: int, prompt_ids: list[int], env: str) -> Rollout:
    where = f"completions[{i}]"
    if not isinstance(c, dict):
        raise GroupFormatError(f"{where}: an object")
    ids = _int_list(c.get("token_ids"), f"{where}.token_ids")
    logprobs = _floats(c.get("logprobs"), len(ids), f"{where}.logprobs")
    weights = c.get("loss_weights") or []
    if weights:
        weights = _floats(weights, len(ids), f"{where}.loss_weights")
    version = c.get("policy_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise GroupFormatError(f"{where}.policy_version: the integer version of the weights that sampled it")
    return Rollout(f"{env}-{i}", prompt_ids, ids, logprobs, str(c.get("finish_reason", "stop")),
                   text=str(c.get("text", "")), policy_version=version, loss_weights=weights,
                   version_runs=_version_runs(c.get("version_runs"), len(ids), version, where))


def _version_runs(value: Any, n: int, version: int, where: str) -> list[tuple[int, int]]:
    """Optional ``[[first token index, version], ...]``: from index 0 (``policy_version``'s run), in order."""
    if value is None:
        return []
    pairs = value if isinstance(value, list) else None
    if pairs is None or not all(isinstance(p, list) and len(p) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in p) for p in pairs):
        raise GroupFormatError(f"{where}.version_runs: a list of [first token index, policy version] pairs")
    starts = [p[0] for p in pairs]
    if pairs and (pairs[0] != [0, version] or starts != sorted(set(starts)) or starts[-1] >= max(n, 1)):
        raise GroupFormatError(f"{where}.version_runs: runs start at token 0 with policy_version ({version}), in "
                               f"increasing order, each inside the {n} completion tokens")
    return [(start, v) for start, v in pairs]


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise GroupFormatError(f"{name}: a list of token ids")
    return list(value)


def _floats(value: Any, n: int, name: str) -> list[float]:
    if not isinstance(value, list) or len(value) != n or not all(isinstance(v, (int, float)) for v in value):
        raise GroupFormatError(f"{name}: {n} numbers, one per completion token")
    return [float(v) for v in value]


def _values(value: Any, n: int, name: str) -> list[float | None]:
    if not isinstance(value, list) or len(value) != n or \
            not all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise GroupFormatError(f"{name}: {n} numbers (or null), one per completion")
    return [None if v is None else float(v) for v in value]
