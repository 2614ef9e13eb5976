"""Acceptance rules of a verify round, chosen by name: which of a row's proposals it keeps, and the token after them.

A rule reads the target's logits over the row's last token and its proposals, the proposals and what drew them,
and returns a ``RejectionResult`` (rejection.py): kept proposals, then the token the rule adds after them. All
device work, no host sync (a round graph may capture it). Registered here:
- ``rejection``: the standard rejection rule (speculative decoding; the output follows the target's distribution);
- ``greedy``: keep while the proposal is the target's argmax, then the argmax (rejection on greedy rows);
- ``forced``: keep every proposal (forced tool tokens, tandem's frozen run: the tandem writer rule), then the
  target's own sample; also the target's own sample at every position, for a run the selector cuts at a boundary.
A benchmark registers its own (bench/speculative.py's fixed acceptance rate) and names it in the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from tandemrl.engine.model.rejection import RejectionResult, rejection_sample
from tandemrl.engine.model.sampler import sample_with_probs


@dataclass
class Verdict:
    """What a rule reads: the target's logits [B, k + 1, V], the proposals [B, k], proposals per row [B], the
    distributions they were drawn from [B, k, V] (None where the rule does not read them), the rows' target
    temperatures [B], their generator, and whether every row is greedy."""

    logits: Tensor
    tokens: Tensor
    num_proposals: Tensor
    probs: Tensor | None
    temperature: Tensor
    generator: torch.Generator | None
    greedy: bool


@dataclass(frozen=True)
class AcceptanceRule:
    """``accept``: a verdict -> what the round keeps (``own``: the target's own samples at every position, or None);
    ``reads_probs``: whether it reads the proposals' distributions (sampled rows only); ``side_output``: whether it
    returns ``own`` (a round graph captures only rules that do not)."""

    accept: Callable[[Verdict], tuple[RejectionResult, tuple[Tensor, Tensor] | None]]
    reads_probs: bool = False
    side_output: bool = False


_RULES: dict[str, AcceptanceRule] = {}


def register_rule(name: str, rule: AcceptanceRule) -> None:
    """Make ``rule`` available by ``name`` (ValueError if the name is taken)."""
    if name in _RULES:
        raise ValueError(f"acceptance rule {name!r} is already registered")
    _RULES[name] = rule


def acceptance_rule(name: str) -> AcceptanceRule:
    """The rule registered as ``name``; ValueError naming the registered ones otherwise."""
    try:
        return _RULES[name]
    except KeyError:
        raise ValueError(f"unknown acceptance rule {name!r}; registered: {', '.join(sorted(_RULES))}") from None


def _rejection(v: Verdict) -> tuple[RejectionResult, None]:
    probs = v.probs if v.probs is not None else torch.zeros((), device=v.tokens.device).expand(
        *v.tokens.shape, v.logits.shape[-1])  # greedy rows read none of it
    return rejection_sample(v.logits, probs, v.tokens, v.num_proposals, v.temperature, v.generator,
                            greedy_only=v.greedy), None


def _greedy(v: Verdict) -> tuple[RejectionResult, None]:
    return _rejection(Verdict(v.logits, v.tokens, v.num_proposals, None, v.temperature, None, True))


def keep_forced(v: Verdict) -> tuple[RejectionResult, tuple[Tensor, Tensor]]:
    """Each row keeps its ``num_proposals[i]`` proposals, then the target's own sample at the next position.
    Log-probs are the target's, for every token, whoever wrote it: the loss needs the trained model's log-prob of
    each kept token. Also the target's own sample at every position, with its log-prob."""
    batch, width, vocab = v.logits.shape
    scale = torch.where(v.temperature > 0, v.temperature, torch.ones_like(v.temperature))  # greedy: raw log-probs
    logp = torch.log_softmax(v.logits.float() / scale[:, None, None], dim=-1)
    own, _ = sample_with_probs(v.logits.reshape(-1, vocab), v.temperature.repeat_interleave(width), v.generator)
    own = own.view(batch, width)
    position = torch.arange(width, device=v.logits.device)
    proposals = torch.cat((v.tokens, v.tokens[:, :1]), dim=1)[:, :width]  # one column more: where ``own`` goes
    out = torch.where(position < v.num_proposals[:, None], proposals, own)
    own_logp = logp.gather(-1, own[..., None]).squeeze(-1)
    return RejectionResult(out, logp.gather(-1, out[..., None]).squeeze(-1), v.num_proposals), (own, own_logp)


register_rule("rejection", AcceptanceRule(_rejection, reads_probs=True))
register_rule("greedy", AcceptanceRule(_greedy))
register_rule("forced", AcceptanceRule(keep_forced, side_output=True))
