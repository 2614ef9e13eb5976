"""How a reward function is named: the spec a user writes (``rewards.py:correct``), the short name the metrics show
(``correct``), and the lookup that accepts either. ``reward.weights``, ``eval.metric`` and the metric keys all go
through these functions, so that one name means the same function everywhere."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from tandemrl.user_code import INLINE

INLINE_REWARD = INLINE  # how a config records a Python API reward callable, which no file can bring back


def short_name(spec: str) -> str:
    """``pkg.mod:fn`` / ``path/file.py:fn`` / ``inline:fn`` -> ``fn`` (``obj.fn`` -> ``fn``); a registered name is
    its own short name."""
    if spec.startswith(INLINE_REWARD):  # the Python API numbers a second callable of one name: inline:1-fn
        return re.sub(r"^\d+-", "", spec[len(INLINE_REWARD):])
    return spec.rpartition(":")[2].rpartition(".")[2] if ":" in spec else spec


def component_names(specs: Sequence[str]) -> list[str]:
    """The name each reward is logged under, in order: its short name, or its full spec where two rewards share a
    short name (neither is preferred: ``a.py:score`` and ``b.py:score`` are logged as such)."""
    counts = Counter(short_name(s) for s in specs)
    return [short_name(s) if counts[short_name(s)] == 1 else s for s in specs]


class AmbiguousRewardName(ValueError):
    """A short name that more than one reward function has."""


def find_reward(name: str, specs: Sequence[str], what: str) -> str | None:
    """The spec in ``specs`` that ``name`` means: the spec itself, else the one spec whose short name it is; None
    when none. ``what`` (e.g. ``reward.weights``) starts the error raised when the short name is shared."""
    if name in specs:
        return name
    matches = [s for s in specs if short_name(s) == name]
    if len(matches) > 1:
        raise AmbiguousRewardName(f"{what} names {name!r}, which is the name of more than one reward function: "
                                  f"{' and '.join(repr(m) for m in matches)}; use the full name of the one meant")
    return matches[0] if matches else None
