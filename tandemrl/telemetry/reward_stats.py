"""Per-step reward statistics beside the composite reward's own: each function's mean and std, and the share of
GRPO groups that teach nothing (TRL's ``frac_reward_zero_std``)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

ZERO_STD = 1e-8  # a group's std at or below this counts as zero (TRL uses torch.isclose(std, 0))


def reward_stats(components: Mapping[str, Sequence[float | None]], total: Sequence[float | None],
                 group_ids: Sequence[int]) -> dict[str, float]:
    """``reward/<name>/mean`` and ``reward/<name>/std`` per reward function over the values it gave (an abstaining
    function's None is left out; population std, 0.0 with no value) and ``frac_reward_zero_std``: the fraction of
    groups whose total rewards are all equal, so every advantage in the group is 0. A group with fewer than two
    valid totals counts as zero-std too: it has no second reward to be relative to."""
    if len(total) != len(group_ids):
        raise ValueError(f"{len(total)} total rewards for {len(group_ids)} group ids")
    out: dict[str, float] = {}
    for name, values in components.items():
        present = [v for v in values if v is not None]
        out[f"reward/{name}/mean"] = statistics.fmean(present) if present else 0.0
        out[f"reward/{name}/std"] = statistics.pstdev(present) if present else 0.0
    groups: dict[int, list[float]] = {}
    for group, value in zip(group_ids, total):
        groups.setdefault(group, [])
        if value is not None:
            groups[group].append(value)
    flat = [len(v) < 2 or statistics.pstdev(v) <= ZERO_STD for v in groups.values()]
    out["frac_reward_zero_std"] = sum(flat) / len(flat) if flat else 0.0
    return out
