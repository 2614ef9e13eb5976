"""Speculative decoding as the engine runs it: each decode step is a VERIFY step (step.py, model/rounds.py), its
proposals from the runner's ``draft`` slot or known on the host (``propose``: e.g. prompt lookup). Scheduling is
synchronous: what a launch kept decides the next one's positions. The policy lives in tandemrl/speculative/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tandemrl.engine.sequence import Sequence

DRAFT = "draft"  # the runner slot of the draft model
Propose = Callable[[Sequence, int], list[int]]  # (a sequence, at most k) -> tokens proposed after its last one


@dataclass(frozen=True)
class Speculation:
    """A speculative engine's VERIFY steps: up to ``num_tokens`` proposals per row a round; ``propose``: proposals
    known on the host (one round a launch), or None: the ``draft`` slot proposes, ``rounds`` rounds a launch."""

    num_tokens: int
    rounds: int = 1
    propose: Propose | None = None
