"""Scored rollouts as GRPO groups: a batch split into its groups, groups joined into a batch.

The asynchronous loop queues finished groups; whoever produced them (the rollout worker, an environment), the
trainer takes a step's worth and joins them into one ``ScoredRollouts``, as a synchronous step would have built it.
"""

from __future__ import annotations

from tandemrl.rewards.composite import RewardResult
from tandemrl.train.rollouts import ScoredRollouts


def join_groups(parts: list[ScoredRollouts]) -> ScoredRollouts:
    """One batch from ``parts`` in order; each part's group ids are shifted past the previous parts'."""
    if not parts:
        raise ValueError("join_groups needs at least one part")
    if len(parts) == 1:
        return parts[0]
    group_ids, offset = [], 0
    for part in parts:
        group_ids += [offset + g for g in part.group_ids]
        offset += max(part.group_ids, default=-1) + 1
    correct = None if any(p.correct is None for p in parts) else [c for p in parts for c in p.correct or []]
    trajectories = None if any(p.trajectories is None for p in parts) else \
        [t for p in parts for t in p.trajectories or []]
    return ScoredRollouts(
        samples=[s for p in parts for s in p.samples], prompts=[t for p in parts for t in p.prompts],
        rollouts=[r for p in parts for r in p.rollouts], reward=join_rewards([p.reward for p in parts]),
        correct=correct, group_ids=group_ids, trajectories=trajectories)


def join_rewards(results: list[RewardResult]) -> RewardResult:
    """Rewards of consecutive parts as one result: values concatenated (None where a part has no such component:
    environments may score with different functions), error and NaN counts summed."""
    names = list(dict.fromkeys(name for r in results for name in r.components))
    return RewardResult(
        total=[t for r in results for t in r.total],
        components={name: [v for r in results for v in r.components.get(name, [None] * len(r.total))]
                    for name in names},
        errors=_sum_counts([r.errors for r in results]),
        first_traceback=next((r.first_traceback for r in results if r.first_traceback), None),
        nonfinite=sum(r.nonfinite for r in results),
        nonfinite_by=_sum_counts([r.nonfinite_by for r in results]))


def group_count(scored: ScoredRollouts) -> int:
    return len(set(scored.group_ids))


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in counts:
        for key, n in part.items():
            total[key] = total.get(key, 0) + n
    return total
