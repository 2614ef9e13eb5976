"""A warning for a run that learns nothing: when every GRPO group's samples got the same reward, every advantage is
0 and the update leaves the policy where it was. TRL logs the share of such groups (``frac_reward_zero_std``) and
goes on; a user whose reward never tells two completions apart would only see it in the curves."""

from __future__ import annotations

from collections.abc import Mapping

FLAT_STEPS_BEFORE_WARNING = 16  # a few flat steps are normal early on (a hard task, a sharp reward); a streak is not


def flat_reward_streak(streak: int, metrics: Mapping[str, float]) -> int:
    """The number of steps in a row, this one included, in which no group's rewards differed."""
    return streak + 1 if metrics["frac_reward_zero_std"] >= 1.0 else 0


def flat_reward_warning(step: int, streak: int, metrics: Mapping[str, float], max_tokens: int) -> str | None:
    """The warning after `streak` flat steps, once the streak reaches FLAT_STEPS_BEFORE_WARNING and again each time
    it doubles (a run that never learns is told, not flooded); None otherwise."""
    periods, rest = divmod(streak, FLAT_STEPS_BEFORE_WARNING)
    if streak == 0 or rest or periods & (periods - 1):
        return None
    clipped = metrics.get("completions/clipped_ratio", 0.0)
    return (
        f"steps {step - streak + 1}-{step}: in every group all samples got the same reward (mean "
        f"{metrics.get('reward/mean', float('nan')):.3g}), so every advantage was 0 and the model did not learn. "
        f"Check that the reward can tell completions apart on this data (one the model never or always earns gives "
        f"no signal). {clipped:.0%} of this step's completions stopped at rollout.max_tokens = {max_tokens}; a "
        f"larger rollout.group_size or rollout.temperature gives more varied groups."
    )
