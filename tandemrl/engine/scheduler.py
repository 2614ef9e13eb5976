"""Continuous batching: which sequences run in the next step, and what a step's sampled tokens finish.

A step is either a prefill (waiting sequences join, each computing the tokens the prefix cache does not hold)
or a decode (every running sequence computes its next tokens: up to ``decode_steps`` of them, each step feeding
the last sampled token back on the device; a sequence's burst never passes its ``max_tokens``). Prefill goes first
whenever a waiting sequence fits the token budget, ``max_num_seqs`` and the free blocks; the first sequence of a
prefill is admitted whatever its length, so a long prompt is never starved by the budget.

With asynchronous scheduling (engine.py) sequences count a launched step's tokens as pending placeholders, and
``postprocess`` puts the real ones in their place; a tandem row's owner stream moves there too, in launch order.

Preemption is by recomputation: when a decode step cannot give a sequence its next block, the most recently
added running sequence gives all its blocks back and returns to the FRONT of the waiting queue, keeping its
generated tokens; its next prefill recomputes them (often partly from the prefix cache).
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from typing import Callable, Iterable, Sequence as Seq

from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.sequence import Sequence, SequenceStatus
from tandemrl.engine.speculative import Speculation
from tandemrl.engine.step import DecodeStep, PrefillStep, StepOutput, StepPlan, VerifyStep
from tandemrl.engine.tandem import FROZEN, OwnerStream, TandemRollouts
from tandemrl.engine.tandem_burst import plan_tandem_burst
from tandemrl.engine.stopping import find_stop, tokens_to_keep

Decode = Callable[[Seq[int]], str]


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_ids: Iterable[int],
                 decode: Decode | None = None, speculative: Speculation | None = None,
                 tandem: TandemRollouts | None = None, paired_tandem: bool = False) -> None:
        self.config = config
        self.tandem = tandem
        self.paired_tandem = paired_tandem  # tandem bursts in ticks of both models (two streams of one GPU)
        self.speculative = speculative  # speculative.py: VERIFY steps
        # tandem.py: a tandem request's owner stream, and per completion token whether hot wrote it; kept beside the
        # sequences (``Sequence`` holds no tandem state), weak keys: they go with their sequence
        self.owner_streams: weakref.WeakKeyDictionary[Sequence, OwnerStream] = weakref.WeakKeyDictionary()
        self.token_sources: weakref.WeakKeyDictionary[Sequence, list[bool]] = weakref.WeakKeyDictionary()
        self.block_manager = block_manager
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.decode = decode  # ids -> text; needed only by requests with stop strings
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    # ------------------------------------------------------------------ queue

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; raises ValueError if it could never run (too long, or larger than the pool)."""
        total = seq.num_prompt_tokens + seq.params.max_tokens
        limit = self.config.max_model_len
        if limit is not None and total > limit:
            raise ValueError(f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({seq.params.max_tokens}) "
                             f"exceeds max_model_len ({limit})")
        bm = self.block_manager
        # The last sampled token is never fed back, so at most total - 1 tokens need K/V slots.
        needed = (total - 1 + bm.block_size - 1) // bm.block_size
        if needed > bm.num_blocks:
            raise ValueError(f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({seq.params.max_tokens}) "
                             f"needs {needed} KV blocks of {bm.block_size} tokens; the pool has only "
                             f"{bm.num_blocks}")
        if seq.params.stop and self.decode is None:
            raise ValueError("stop strings need a tokenizer to decode the completion")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence) -> None:
        """Drop ``seq`` from whichever queue holds it and free its blocks."""
        for queue in (self.waiting, self.running):
            if seq in queue:
                queue.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED

    def requeue(self, seqs: list[Sequence]) -> None:
        """Undo a prefill that did not run: free the sequences' blocks, put them back at the front, in order, and
        unpublish the blocks it registered (their K/V was never written)."""
        self.block_manager.forget_cached_blocks()
        for seq in reversed(seqs):
            self.running.remove(seq)
            self.block_manager.deallocate(seq)
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def preempt_all(self) -> None:
        """Send every running sequence back to waiting (oldest first), freeing all blocks."""
        while self.running:
            self._preempt(self.running.pop())

    # ------------------------------------------------------------------ schedule

    def schedule(self, in_flight: bool = False) -> StepPlan:
        """The plan of the next step; an empty plan when idle. ``in_flight``: a launched step's tokens are still
        pending on the device; then nobody is preempted (an empty plan instead: read those tokens back first)."""
        batch = self._schedule_prefill()
        if batch:
            forced = [self._next_segment(s, 1)[0] for s in batch] if self.tandem else None
            return PrefillStep(batch, [1] * len(batch), forced=forced, proposer=FROZEN)
        return self._schedule_decode(in_flight)

    def _schedule_prefill(self) -> list[Sequence]:
        bm, cfg = self.block_manager, self.config
        batch: list[Sequence] = []
        computed = 0
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            new_blocks, cached = bm.probe(seq)
            over_budget = batch and computed + seq.num_tokens - cached > cfg.max_num_batched_tokens
            if over_budget or new_blocks > bm.num_free_blocks:
                break
            bm.allocate(seq)
            seq.kv_complete_tokens = None
            computed += seq.num_tokens - seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
        return batch

    def _schedule_decode(self, in_flight: bool) -> StepPlan:
        # A sequence whose remaining tokens are all pending on the device only waits for them to be read back.
        running = [s for s in self.running if s.num_completion_tokens < s.params.max_tokens]
        if not running:
            return DecodeStep([], [])  # idle
        if self.tandem is not None:
            if any(s in self.owner_streams for s in running):
                tandem = self._schedule_tandem_burst if self.tandem.drawn_ahead else self._schedule_tandem_segments
                return tandem(running, in_flight)
            # Rows the hot model decodes alone (requests outside tandem): the frozen model's cache stops at their last
            # token, so the prefix cache must not offer those blocks to a tandem prompt (sequence.py's
            # ``kv_complete_tokens``; a prefill fills every slot again).
            for seq in running:
                if seq.kv_complete_tokens is None:
                    seq.kv_complete_tokens = seq.num_tokens - 1
        if self.speculative is not None:
            return self._schedule_verify(running, in_flight)
        if self.config.decode_steps > 1:  # a burst, if the free blocks cover every sequence's lookahead
            steps = [min(self.config.decode_steps, s.params.max_tokens - s.num_completion_tokens) for s in running]
            if self.block_manager.try_append_all(running, steps):
                return DecodeStep(running, steps)
        return self._schedule_single_steps(running, in_flight)

    def _schedule_verify(self, running: list[Sequence], in_flight: bool) -> StepPlan:
        """Speculative decoding (speculative.py), each row's blocks reserved for its budget (every proposal kept). If
        the free blocks cannot cover that, half the rounds, down to one, then a step with no proposals, which may
        preempt."""
        k, propose = self.speculative.num_tokens, self.speculative.propose
        remaining = [s.params.max_tokens - s.num_completion_tokens for s in running]
        if propose is None:  # the draft proposes on the device, ``rounds`` rounds a launch (fewer blocks: fewer)
            rounds = self._verify_rounds(running, remaining)
            for r in (rounds >> i for i in range(rounds.bit_length())):  # halved while the free blocks are short
                budgets = [min(r * (k + 1), left) for left in remaining]
                if self.block_manager.try_append_all(running, budgets):
                    return VerifyStep(running, budgets, rounds=r, num_proposals=k)
            plan = self._schedule_single_steps(running, in_flight)
            return VerifyStep(plan.seqs, plan.num_tokens, num_proposals=k)
        feed = [propose(s, min(k, left - 1)) if left > 1 else [] for s, left in zip(running, remaining)]
        if self.block_manager.try_append_all(running, [len(f) + 1 for f in feed]):
            return VerifyStep(running, [len(f) + 1 for f in feed], proposer="host", feed=feed)
        plan = self._schedule_single_steps(running, in_flight)
        return VerifyStep(plan.seqs, plan.num_tokens, proposer="host", feed=[[] for _ in plan.seqs])

    def _verify_rounds(self, running: list[Sequence], remaining: list[int]) -> int:
        """Rounds of the next launch of draft proposals: as many as the row furthest from its end is expected to
        need at the tokens a round it kept so far (k + 1 before its first), at most ``speculative.rounds``. A row
        with its budget spent computes only dead rows until the launch ends."""
        k, need = self.speculative.num_tokens, 1
        for seq, left in zip(running, remaining):
            steps = seq.stats.verify_steps
            per_round = 1 + seq.stats.accepted_tokens / steps if steps else k + 1
            need = max(need, math.ceil(left / per_round))
        return min(self.speculative.rounds, need)

    def _schedule_tandem_burst(self, running: list[Sequence], in_flight: bool) -> StepPlan:
        """Tandem with writers drawn ahead: a burst of up to 4 x ``decode_steps`` forwards (tandem_burst.py; about
        2.5 x / 2 x ``decode_steps`` positions: longer than a plain burst, as each ends with two catch-up forwards);
        if the free blocks cannot cover it, one token each, which may preempt."""
        forwards = 4 * self.config.decode_steps
        burst = plan_tandem_burst([self._writers(s, min(forwards, s.params.max_tokens - s.num_completion_tokens))
                                   for s in running], forwards, paired=self.paired_tandem)
        planned = burst.num_tokens.tolist()
        if self.block_manager.try_append_all(running, planned):
            return DecodeStep(running, planned, proposer=FROZEN, tandem=burst)
        plan = self._schedule_single_steps(running, in_flight)
        if not plan:
            return plan
        return DecodeStep(plan.seqs, plan.num_tokens, proposer=FROZEN,
                        tandem=plan_tandem_burst([self._writers(s, 1) for s in plan.seqs], 0))

    def _schedule_tandem_segments(self, running: list[Sequence], in_flight: bool) -> StepPlan:
        """Tandem with writers that depend on the tokens (sentence, word): each row's next segment (tandem.py); if
        the free blocks cannot cover that, one token each, which may preempt."""
        cap = self.tandem.max_run_tokens
        segments = [self._next_segment(s, min(cap, s.params.max_tokens - s.num_completion_tokens)) for s in running]
        planned = [r + hot for r, hot in segments]
        if self.block_manager.try_append_all(running, planned):
            return VerifyStep(running, planned, proposer=FROZEN, rule="forced", forced=[r for r, _ in segments])
        plan = self._schedule_single_steps(running, in_flight)
        return VerifyStep(plan.seqs, plan.num_tokens, proposer=FROZEN, rule="forced",
                          forced=[self._next_segment(s, 1)[0] for s in plan.seqs])

    def _writers(self, seq: Sequence, n: int) -> list[bool]:
        """The writers of the ``n`` positions after the sequence's last one, pending placeholders included (True =
        hot); a request outside tandem is the hot model's alone. The owner stream moves only in ``postprocess``, so
        with a step in flight its next positions are the pending ones: peek past them."""
        owners = self.owner_streams.get(seq)
        return [True] * n if owners is None else owners.peek(seq.num_pending + n)[seq.num_pending:]

    def _next_segment(self, seq: Sequence, limit: int) -> tuple[int, bool]:
        """(frozen positions next, whether a hot one follows) from the sequence's owner stream; a request outside
        tandem is the hot model's alone."""
        owners = self.owner_streams.get(seq)
        return owners.next_segment(limit) if owners is not None else (0, True)

    def _schedule_single_steps(self, running: list[Sequence], in_flight: bool) -> StepPlan:
        """One token for every running sequence, preempting the youngest while the blocks run short."""
        bm = self.block_manager
        if bm.try_append_all(running):  # one step for everyone: nobody is preempted
            return DecodeStep(running, [1] * len(running))
        if in_flight:  # a victim may still have tokens on the device: decide once they are read back
            return DecodeStep([], [])  # idle
        batch: list[Sequence] = []
        pending = self.running  # oldest first; victims come from its end
        while pending:
            seq = pending.popleft()
            while not bm.can_append(seq) and pending:
                self._preempt(pending.pop())
            if bm.can_append(seq):
                bm.may_append(seq)
                batch.append(seq)
            else:  # nobody younger left to evict
                self._preempt(seq)
        self.running = deque(batch)
        return DecodeStep(batch, [1] * len(batch))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        seq.stats.preemptions += 1

    # ------------------------------------------------------------------ postprocess

    def postprocess(self, plan: StepPlan, output: StepOutput, now: float = 0.0) -> list[Sequence]:
        """Put each row's tokens in place of the placeholders its step reserved, up to the one that finishes it (the
        rest is dropped); return (and free) the sequences that finished. Placeholders of a step launched later stay
        behind them (a finished sequence drops them too); a sequence finished meanwhile (aborted, or stopped by an
        earlier step) ignores them. ``now``: the engine's clock, for the request stats."""
        output.check(plan)
        forced = None if isinstance(plan, DecodeStep) else plan.forced  # tandem: the frozen model's runs
        finished: list[Sequence] = []
        eos_ids = self.eos_ids
        for i, (seq, planned, tokens, lps) in enumerate(zip(plan.seqs, plan.num_tokens, output.token_ids,
                                                             output.logprobs)):
            if seq.is_finished:
                continue
            rounds = None if output.num_accepted is None else output.num_accepted[i]
            accepted = None if rounds is None else sum(rounds)
            owners = self.owner_streams.get(seq) if self.tandem is not None else None
            if forced is not None and owners is not None and forced[i]:
                tokens, lps, accepted = _cut_frozen_run(owners, forced[i], tokens, lps, output, i)
            if seq.stats.first_token_time is None and tokens:
                seq.stats.first_token_time = now
            params = seq.params
            known = seq.num_known_tokens - seq.num_prompt_tokens
            # Fast path, most sequences of most steps: nothing in this step can finish them.
            if (not params.stop and known + len(tokens) < params.max_tokens
                    and (params.ignore_eos or eos_ids.isdisjoint(tokens))):
                seq.fill_pending(planned, tokens, lps)
                kept = len(tokens)
            else:
                later = seq.release_step(planned, len(tokens))  # the stop checks below read the completion's tail
                kept = self._append_until_finished(seq, tokens, lps, now)
                if seq.is_finished:
                    finished.append(seq)
                elif later:
                    seq.add_pending(later)
            if rounds is not None and isinstance(plan, VerifyStep) and forced is None:  # speculative: rounds it kept
                _record_rounds(seq, plan, i, rounds, kept)
            writers = _step_writers(plan, forced, i, accepted, len(tokens))
            if writers is not None:  # tandem: who wrote each kept token; the owner stream moves on
                sources = self.token_sources.setdefault(seq, [])
                sources.extend(writers[:kept])
                del sources[seq.num_completion_tokens:]  # a stop string may have cut the completion
                if owners is not None:
                    owners.advance(tokens[:kept], writers[:kept])
        if finished:
            self.running = deque(s for s in self.running if not s.is_finished)
        return finished

    def _append_until_finished(self, seq: Sequence, tokens: list[int], lps: list[float], now: float) -> int:
        """Append tokens one by one until one finishes the sequence; how many were appended."""
        for n, (token, logprob) in enumerate(zip(tokens, lps), start=1):
            seq.append_token(token, logprob)
            if (reason := self._finish_reason(seq, seq.token_ids[-1])) is not None:
                self._finish(seq, reason, now)
                return n
        return len(tokens)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stats.finished_time = now
        seq.stats.generated_tokens = seq.num_completion_tokens
        self.block_manager.register_finished(seq)
        self.block_manager.deallocate(seq)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        eos = not params.ignore_eos and token in self.eos_ids
        length = seq.num_completion_tokens >= params.max_tokens
        # a stop string (add() made sure it comes with a tokenizer) cuts the completion first, even one ending in EOS
        if (params.stop and (eos or length or self._recent_stop(seq)) and self._cut_at_stop(seq)) or eos:
            return "stop"
        return "length" if length else None

    def _recent_stop(self, seq: Sequence) -> bool:
        """Cheap per-step test: does the text of the last few tokens contain a stop string?"""
        window = max(len(s) for s in seq.params.stop) + 8
        return find_stop(self.decode(seq.completion_ids[-window:]), seq.params.stop) is not None

    def _cut_at_stop(self, seq: Sequence) -> bool:
        """If the completion's text contains a stop string, keep tokens up to the one that completed it."""
        keep = tokens_to_keep(seq.completion_ids, self.decode, seq.params.stop)
        if keep is None:
            return False
        del seq.token_ids[seq.num_prompt_tokens + keep:]
        del seq.logprobs[keep:]
        return True


def _step_writers(plan: StepPlan, forced: list[int] | None, row: int, accepted: int | None,
                  returned: int) -> list[bool] | None:
    """Tandem: the writer of each token a row returned (True = hot): fixed by a burst's plan, or a segment's frozen
    run then the hot token; None outside tandem."""
    if isinstance(plan, DecodeStep) and plan.tandem is not None:
        return plan.tandem.owners[row]
    if forced is not None:
        return [False] * accepted + [True] * (returned - accepted)
    return None


def _cut_frozen_run(owners: OwnerStream, forced: int, tokens: list[int], lps: list[float], output: StepOutput,
                    row: int) -> tuple[list[int], list[float], int]:
    """Tandem: a frozen run the selector ends early (a boundary token inside it) continues with the target's own
    token where it was cut. (tokens, log-probs, frozen tokens kept)."""
    kept, _ = owners.resolve(tokens[:forced])
    if kept == forced or output.own_ids is None or output.own_logprobs is None:
        return tokens, lps, forced
    return tokens[:kept] + [output.own_ids[row][kept]], lps[:kept] + [output.own_logprobs[row][kept]], kept


def _record_rounds(seq: Sequence, plan: VerifyStep, row: int, accepted: list[int], kept: int) -> None:
    """Speculative telemetry: each verify round of the row's step whose tokens the sequence kept (none after its end
    or after its budget ``num_tokens[row]``), with the proposals it drafted (step.py)."""
    emitted = 0
    for a in accepted:
        if emitted >= kept:
            break
        drafted = min(plan.k, plan.num_tokens[row] - emitted - 1)
        seq.stats.record_verify(drafted, a)
        emitted += a + 1
