"""The contract of one engine step: the scheduler's plan and what the model runner returns for it.

A plan is one of three types, one per kind (``StepPlan``), each naming the model slot that runs it and, per row, how
many tokens the row is planned to produce:
- PREFILL: the row's uncached tokens are computed; one token is sampled after the last (``num_tokens`` 1);
- DECODE: a burst of ``num_tokens[i]`` steps, each feeding the token sampled at the one before, on the device; with
  ``tandem``, two models take turns writing the rows, each position by the model the plan names (a row returns
  exactly its ``num_tokens[i]``, so a later step may be in flight; the one exception to "tandem is rounds": see
  docs/tandem.md);
- VERIFY: rounds of a proposer and an acceptance rule (model/rounds.py): the rule keeps a prefix of each round's
  proposals and adds the model's own token after it, so a row may return fewer tokens than planned;
  ``num_accepted`` says how many proposals each round kept.

The engine reserves ``num_tokens[i]`` pending placeholders per row at launch (sequence.py) and replaces them with
however many tokens the row returns, fewer or more (a step that writes a run of forced tokens may return more).
Only a row whose count matches its plan may have a later step in flight: that step's positions assumed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from tandemrl.engine.sequence import Sequence
from tandemrl.engine.tandem import FROZEN
from tandemrl.engine.tandem_burst import TandemBurst

TARGET = "target"  # the slot of the model whose tokens the engine returns (the trained policy)


class StepKind(Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    VERIFY = "verify"


@dataclass
class _Rows:
    """What every kind of step plans: its rows, per row the tokens it is planned to produce (the most it may return),
    and the model slot that runs it."""

    seqs: list[Sequence]
    num_tokens: list[int]
    slot: str = TARGET
    kind: ClassVar[StepKind]

    def __post_init__(self) -> None:
        if len(self.num_tokens) != len(self.seqs):
            raise ValueError(f"a step plan needs one token count per row, got {len(self.num_tokens)} for "
                             f"{len(self.seqs)} rows")

    @property
    def is_prefill(self) -> bool:
        return self.kind is StepKind.PREFILL

    def __bool__(self) -> bool:
        return bool(self.seqs)


@dataclass
class PrefillStep(_Rows):
    """``forced`` (tandem): per row, 1 where the ``proposer`` slot writes the row's first token."""

    kind: ClassVar[StepKind] = StepKind.PREFILL
    forced: list[int] | None = None
    proposer: str = FROZEN


@dataclass
class DecodeStep(_Rows):
    """``tandem``: the burst (tandem_burst.py) by which the target (hot) and the ``proposer`` (frozen) slots write the
    row's ``num_tokens[i]`` tokens, whose writers it fixes; None: the target alone."""

    kind: ClassVar[StepKind] = StepKind.DECODE
    tandem: TandemBurst | None = None
    proposer: str = FROZEN


@dataclass
class VerifyStep(_Rows):
    """``rounds`` rounds of the ``proposer`` (proposers.py: ``draft``, ``frozen``, ``host``) and the acceptance
    ``rule`` (acceptance.py; None: the runner's rule for speculative proposals). A row proposes
    ``min(num_proposals, left - 1)`` tokens a round, ``left`` what remains of its ``num_tokens[i]`` (a row that has
    them all computes nothing more). ``feed`` (``host``): per row, its proposals, ``num_tokens[i] - 1`` of them.
    ``forced`` (rule ``forced``: tandem segments): per row, the proposals it keeps, all of them; the target writes
    the rest of its ``num_tokens`` (0 or 1 token)."""

    kind: ClassVar[StepKind] = StepKind.VERIFY
    proposer: str = "draft"
    rule: str | None = None
    num_proposals: int = 1
    rounds: int = 1
    feed: list[list[int]] | None = None
    forced: list[int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.feed is not None) != (self.proposer == "host"):
            raise ValueError("a verify step of host proposals needs one list of feed tokens per row (and only it)")
        if self.feed is not None and (len(self.feed) != len(self.seqs)
                                      or any(n != len(f) + 1 for n, f in zip(self.num_tokens, self.feed))):
            raise ValueError("a verify step needs one list of feed tokens per row, and a row plans len(feed) + 1")
        if (self.forced is not None) != (self.rule == "forced"):
            raise ValueError("the forced rule needs the count of forced proposals per row (and only it)")
        if self.forced is not None and any(not 0 <= f <= n for f, n in zip(self.forced, self.num_tokens)):
            raise ValueError("a tandem row keeps between 0 and num_tokens proposals")
        if self.rounds < 1 or self.num_proposals < 1:
            raise ValueError(f"a verify step needs rounds >= 1 and num_proposals >= 1, got {self.rounds} and "
                             f"{self.num_proposals}")
        if self.rounds != 1 and (self.feed is not None or self.forced is not None):
            raise ValueError("only a verify step of a model's speculative proposals runs several rounds")

    @property
    def k(self) -> int:
        """Proposals per round at most (the width of a round)."""
        if self.feed is not None:
            return max(1, max(len(f) for f in self.feed))
        if self.forced is not None:
            return max(1, max(self.forced))
        return self.num_proposals


StepPlan = PrefillStep | DecodeStep | VerifyStep


@dataclass
class StepOutput:
    """Per row of the plan: the tokens it produced and their log-probs (under the distribution each was sampled
    from); for a verify step, how many proposals each row kept in each round."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    num_accepted: list[list[int]] | None = None  # per row, the proposals each of its verify rounds kept
    # tandem: the target's own sample (and its log-prob) at every position the row fed, for a run cut short by the
    # selector (a boundary token in the frozen run) to end with the target's token where it was cut
    own_ids: list[list[int]] | None = None
    own_logprobs: list[list[float]] | None = None

    def check(self, plan: StepPlan) -> None:
        """RuntimeError unless this output has a row per plan row (the runner's bug otherwise, which must not
        corrupt the sequences); rows are checked as they are applied (Sequence.fill_pending)."""
        rows = len(plan.seqs)
        if len(self.token_ids) != rows or len(self.logprobs) != rows:
            raise RuntimeError(f"the model runner returned tokens for {len(self.token_ids)} and log-probs for "
                               f"{len(self.logprobs)} of {rows} rows")
