"""Proposers of a verify round, chosen by name: who writes the tokens the target then reads in one forward.

- ``draft`` / ``frozen``: a model slot of that name proposes on the device (a speculative draft; tandem's frozen
  partner). Each round it reads the row's last two tokens (positions L - 2 and L - 1: when the previous round kept
  all its proposals it never read the last one; otherwise it writes the same K/V again, so its cache never falls
  behind) and proposes ``k`` tokens, each sampled (temperature only; greedy rows: its argmax) and fed back to it.
- ``host``: tokens known on the host (n-gram lookups, forced tool or frozen runs), padded with 0 past a row's own.
Either's round is graph-safe when every row is greedy (round_graph.py): a host proposer's tokens are then loaded into
the graph's static buffer with the rest of the launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import copy_to_device
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.slot import ModelSlot
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import TARGET

Sample = Callable[[Tensor, slice], tuple[Tensor, Tensor]]  # (logits, rows) -> (tokens, log-probs)


class Proposer(Protocol):
    forwards: bool  # runs forwards of its own each round (its rows come first in the round's columns)

    def propose(self, last_two: Tensor, columns: list[Tensor]) -> tuple[Tensor, Tensor | None]:
        """Proposals [B, k] on the runner's device, and the logits they were drawn from [B, k, V] (None: argmax
        or host tokens)."""

    def distributions(self, tokens: Tensor, logits: Tensor | None) -> Tensor:
        """[B, k, V] float32: what each proposal was drawn from (the rejection rule reads it for sampled rows)."""


@dataclass
class ModelProposer:
    """A model slot's proposals (module docstring); ``first`` and ``step``: its column forwards over the launch's
    table, rows twice and once (``ModelSlot.column_forward``); ``sample`` None: every row greedy."""

    slot: ModelSlot
    first: Callable[[Tensor, Tensor], Tensor]
    step: Callable[[Tensor, Tensor], Tensor]
    sample: Sample | None
    temperature: Tensor | None  # the rows' temperatures on the slot's device (sampled rows)
    forwards = True

    def propose(self, last_two: Tensor, columns: list[Tensor]) -> tuple[Tensor, Tensor | None]:
        slot, home = self.slot, last_two.device
        on_slot = [move(c, slot.device) for c in columns]
        hidden = self.first(move(last_two.reshape(-1), slot.device), on_slot[0])[1::2]  # the last token's row
        tokens, all_logits = [], []
        for j in range(len(on_slot)):
            if j:
                hidden = self.step(tokens[-1], on_slot[j])
            with slot.on_device():
                logits = slot.logits(hidden)
                proposal = logits.argmax(-1) if self.sample is None else self.sample(logits, slice(None))[0]
            tokens.append(proposal)
            if self.sample is not None:
                all_logits.append(logits)
        logits = torch.stack(all_logits, dim=1) if self.sample is not None else None
        return move(torch.stack(tokens, dim=1), home), logits

    def distributions(self, tokens: Tensor, logits: Tensor | None) -> Tensor:
        scale = torch.where(self.temperature > 0, self.temperature, torch.ones_like(self.temperature))
        return move((logits.float() / scale[:, None, None]).softmax(dim=-1), tokens.device)


@dataclass
class HostProposer:
    """Tokens known on the host, [B, k] on the device (0 past a row's own: a valid id the target may read)."""

    tokens: Tensor
    vocab_size: int
    forwards = False

    def propose(self, last_two: Tensor, columns: list[Tensor]) -> tuple[Tensor, None]:
        return self.tokens, None

    def distributions(self, tokens: Tensor, logits: Tensor | None) -> Tensor:
        return torch.zeros((*tokens.shape, self.vocab_size), device=tokens.device).scatter_(-1, tokens[..., None], 1.0)


@dataclass
class ProposerArgs:
    """What a proposer is built from: the launch's rows, proposals per round ``k``, the host's proposals (``host``),
    the launch's table with rows twice and once (``tables``), whether every row is greedy and whether its forwards
    must run eagerly (inside a round graph's capture)."""

    context: LaunchContext
    seqs: Seq[Sequence]
    k: int
    feed: Seq[Seq[int]] | None
    tables: tuple[Tensor, Tensor]
    greedy: bool
    eager: bool = False
    host_tokens: Tensor | None = None  # a round graph's static [B, k] buffer, loaded with ``feed`` each launch


def model_proposer(name: str, args: ProposerArgs) -> ModelProposer:
    """The ``name`` slot proposing for the launch's rows."""
    context, seqs, greedy, eager = args.context, args.seqs, args.greedy, args.eager
    slot = context.slots.get(name)
    if slot is None:
        raise ValueError(f"a verify step of {name!r} proposals needs a {name!r} model slot")
    twice, once = args.tables
    first = slot.column_forward(move(twice, slot.device), np.repeat(np.arange(len(once)), 2), eager=eager)
    step = slot.column_forward(move(once, slot.device), eager=eager)
    if greedy:
        return ModelProposer(slot, first, step, None, None)
    sampler = context.sampler_for(slot)
    return ModelProposer(slot, first, step, sampler.for_subsets(seqs, temperature_only=True),
                         sampler.temperatures(seqs))


def host_proposer(name: str, args: ProposerArgs) -> HostProposer:
    """``args.feed[i]``: row i's proposals known on the host (at most ``k``); or a round graph's buffer of them."""
    tokens = args.host_tokens
    if tokens is None:
        tokens = copy_to_device(torch.from_numpy(host_tokens(args.feed, args.k, len(args.feed))), args.context.device)
    return HostProposer(tokens, args.context.slots[TARGET].spec.vocab_size)


def host_tokens(feed: Seq[Seq[int]], k: int, rows: int) -> np.ndarray:
    """[rows, k] int64: row i's proposals ``feed[i]``, then 0 (rows past the feed: all 0)."""
    host = np.zeros((rows, k), dtype=np.int64)
    for i, tokens in enumerate(feed):
        host[i, :len(tokens)] = tokens
    return host


HOST = "host"
# name -> (name, what a launch gives) -> the proposer; a model proposer's name is its slot's
PROPOSERS: dict[str, Callable[[str, ProposerArgs], Proposer]] = {
    "draft": model_proposer, "frozen": model_proposer, HOST: host_proposer}


def make_proposer(name: str, args: ProposerArgs) -> Proposer:
    """The proposer registered as ``name``; ValueError naming the registered ones otherwise."""
    if name not in PROPOSERS:
        raise ValueError(f"unknown proposer {name!r}; registered: {', '.join(sorted(PROPOSERS))}")
    return PROPOSERS[name](name, args)
