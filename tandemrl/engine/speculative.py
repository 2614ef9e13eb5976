"""Speculative decoding as the engine runs it: which rows propose how many tokens each step, and who proposes.

Each decode step of a speculative engine is a VERIFY step (step.py): every running sequence proposes up to
``num_tokens`` tokens, the target model checks them in one forward and keeps them up to the first rejection
(model/rejection.py: the output distribution is the target's). Proposals come from a draft model in the runner's
``draft`` slot (it proposes on the device, inside the launch, for ``rounds`` verify rounds in a row:
model/rounds.py) or are known on the host (``propose``: e.g. prompt lookup, tandemrl/speculative/ngram.py).
Scheduling is synchronous: what a launch kept decides the next one's positions. The policy (the config, the
n-gram index) lives above the engine, in tandemrl/speculative/.
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
