"""Per-step aggregates of multi-turn trajectories: tool use, errors, turns, inserted and re-prefilled tokens."""

from __future__ import annotations

from typing import Sequence

from tandemrl.types import Trajectory


def tool_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``tools/calls_per_traj`` and ``tools/errors`` (failed calls per trajectory), the share of trajectories that
    used a tool, turns, tokens the tools inserted, and history tokens re-prefilled when turns resumed."""
    n = len(trajectories)
    if not n:
        return {}
    calls = sum(len(t.tool_calls) for t in trajectories)
    errors = sum(t.tool_errors for t in trajectories)
    return {
        "tools/calls_per_traj": calls / n,
        "tools/errors": errors / n,
        "tools/error_rate": errors / calls if calls else 0.0,
        "tools/used_fraction": sum(bool(t.tool_calls) for t in trajectories) / n,
        "tools/turns_per_traj": sum(t.turns for t in trajectories) / n,
        "tools/inserted_tokens_per_traj": sum(t.inserted_tokens for t in trajectories) / n,
        "tools/reprefill_tokens_per_traj": sum(t.reprefill_tokens for t in trajectories) / n,
    }
