"""The contract of one engine step: the scheduler's plan and what the model runner returns for it.

A plan names its kind, the model slot that runs it and, per row, how many tokens the row is planned to produce:
- PREFILL: the row's uncached tokens are computed; one token is sampled after the last (``num_tokens`` 1);
- DECODE: a burst of ``num_tokens[i]`` steps, each feeding the token sampled at the one before, on the device; with
  ``tandem``, two models take turns writing the rows, each position by the model the plan names (a row returns
  exactly its ``num_tokens[i]``, so a later step may be in flight);
- VERIFY: the row's last token and its proposed tokens are computed in one forward, the proposals kept up to the
  first one the model rejects (rejection sampling: the output follows the model's distribution; a greedy row keeps
  the proposals its argmax agrees with), ending with the model's own token there (or after the last proposal).
  The proposals are ``feed`` (tokens known on the host: n-gram proposals, forced tokens) or, with ``feed`` None,
  ``num_tokens[i] - 1`` tokens the runner's draft slot proposes in the same launch. A row may thus return fewer
  tokens than planned, and ``num_accepted`` says how many proposals it kept.

The engine reserves ``num_tokens[i]`` pending placeholders per row at launch (sequence.py) and replaces them with
however many tokens the row returns, fewer or more (a step that writes a run of forced tokens may return more).
Only a row whose count matches its plan may have a later step in flight: that step's positions assumed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tandemrl.engine.sequence import Sequence
from tandemrl.engine.tandem_burst import TandemBurst

TARGET = "target"  # the slot of the model whose tokens the engine returns (the trained policy)


class StepKind(Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    VERIFY = "verify"


@dataclass
class StepPlan:
    kind: StepKind
    seqs: list[Sequence]
    num_tokens: list[int]  # per row: tokens it is planned to produce (the most it may return)
    slot: str = TARGET
    feed: list[list[int]] | None = None  # VERIFY: per row, the proposals known on the host (None: the draft's)
    # VERIFY as tandem decoding: per row, how many proposals the ``proposer`` slot writes; all are kept, and the
    # target writes the rest of the row's ``num_tokens`` (0 or 1 token).
    forced: list[int] | None = None
    proposer: str = "draft"
    # DECODE as a tandem burst (tandem_burst.py): the forwards by which the target (hot) and the proposer (frozen)
    # slots write the row's ``num_tokens[i]`` tokens, whose writers it fixes
    tandem: TandemBurst | None = None
    # VERIFY with the draft proposing (feed and forced None; draft_rounds.py): ``rounds`` rounds of proposals and
    # verify back to back on the device, row i proposing min(num_proposals, left - 1) tokens a round, ``left`` what
    # remains of its ``num_tokens[i]`` (a row that has them all computes nothing more)
    rounds: int = 1
    num_proposals: int = 0

    def __post_init__(self) -> None:
        if len(self.num_tokens) != len(self.seqs):
            raise ValueError(f"a step plan needs one token count per row, got {len(self.num_tokens)} for "
                             f"{len(self.seqs)} rows")
        if self.forced is not None and any(not 0 <= f <= n for f, n in zip(self.forced, self.num_tokens)):
            raise ValueError("a tandem row keeps between 0 and num_tokens proposals")
        if self.kind is StepKind.VERIFY and self.feed is not None:
            if len(self.feed) != len(self.seqs):
                raise ValueError("a verify step needs one list of feed tokens per row (or none: the draft proposes)")
            if any(n != len(f) + 1 for n, f in zip(self.num_tokens, self.feed)):
                raise ValueError("a verify row plans len(feed) + 1 tokens")
        if self.drafted and (self.rounds < 1 or self.num_proposals < 1):
            raise ValueError(f"a verify step of draft proposals needs rounds >= 1 and num_proposals >= 1, got "
                             f"{self.rounds} and {self.num_proposals}")
        if self.rounds != 1 and not self.drafted:
            raise ValueError("only a verify step of draft proposals runs several rounds")

    @property
    def drafted(self) -> bool:
        """A verify step whose proposals the draft slot makes on the device (in rounds)."""
        return self.kind is StepKind.VERIFY and self.feed is None and self.forced is None

    @property
    def proposals(self) -> list[int]:
        """Tokens each row proposes (in its first round): the forced runs of a tandem step, else all but the target's
        last."""
        if self.forced is not None:
            return self.forced
        if self.drafted:
            return [min(self.num_proposals, n - 1) for n in self.num_tokens]
        return [n - 1 for n in self.num_tokens]

    @property
    def is_prefill(self) -> bool:
        return self.kind is StepKind.PREFILL

    def __bool__(self) -> bool:
        return bool(self.seqs)

    @classmethod
    def idle(cls) -> StepPlan:
        """Nothing to run this step."""
        return cls(StepKind.DECODE, [], [])


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
