"""Continuous batching: which sequences run in the next step, and what a step's sampled tokens finish.

A step is either a prefill (waiting sequences join, each computing the tokens the prefix cache does not hold)
or a decode (every running sequence computes its next tokens: up to ``decode_steps`` of them, each step feeding
the last sampled token back on the device; a sequence's burst never passes its ``max_tokens``). Prefill goes first whenever a waiting sequence fits
the token budget, ``max_num_seqs`` and the free blocks; the first sequence of a prefill is admitted whatever
its length, so a long prompt is never starved by the budget.

With asynchronous scheduling (engine.py) the next step is scheduled while the last one's tokens are still on the
device: sequences count them as pending placeholders, and ``postprocess_steps`` puts the real ones in their place.

Preemption is by recomputation: when a decode step cannot give a sequence its next block, the most recently
added running sequence gives all its blocks back and returns to the FRONT of the waiting queue, keeping its
generated tokens; its next prefill recomputes them (often partly from the prefix cache).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, NamedTuple, Sequence as Seq

from tandemrl.backends.stopping import find_stop, tokens_to_keep
from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.sequence import Sequence, SequenceStatus

Decode = Callable[[Seq[int]], str]


class ScheduledBatch(NamedTuple):
    seqs: list[Sequence]
    is_prefill: bool
    steps: list[int]  # tokens each sequence computes this engine step (1 in a prefill)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_ids: Iterable[int],
                 decode: Decode | None = None) -> None:
        self.config = config
        self.block_manager = block_manager
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.decode = decode  # ids -> text; needed only by requests with stop strings
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    # ------------------------------------------------------------------ queue

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; raises ValueError if it could never run (too long, or larger than the pool)."""
        self.check_feasible(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def check_feasible(self, seq: Sequence) -> None:
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

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence) -> None:
        """Drop ``seq`` from whichever queue holds it and free its blocks."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED

    def requeue(self, seqs: list[Sequence]) -> None:
        """Undo a prefill that did not run: free the sequences' blocks, put them back at the front, in order."""
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

    def schedule(self, in_flight: bool = False) -> ScheduledBatch:
        """The sequences of the next step; an empty batch when idle. ``in_flight``: a launched step's tokens are still
        pending on the device; then nobody is preempted (an empty batch instead: read those tokens back first)."""
        batch = self._schedule_prefill()
        if batch:
            return ScheduledBatch(batch, True, [1] * len(batch))
        return self._schedule_decode(in_flight)

    def _schedule_prefill(self) -> list[Sequence]:
        bm, cfg = self.block_manager, self.config
        batch: list[Sequence] = []
        computed = 0
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            new_blocks, cached = bm.probe(seq)
            if batch and computed + seq.num_tokens - cached > cfg.max_num_batched_tokens:
                break
            if new_blocks > bm.num_free_blocks:
                break
            bm.allocate(seq)
            computed += seq.num_tokens - seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
        return batch

    def _schedule_decode(self, in_flight: bool) -> ScheduledBatch:
        bm = self.block_manager
        # A sequence whose remaining tokens are all pending on the device only waits for them to be read back.
        running = [s for s in self.running if s.num_completion_tokens < s.params.max_tokens]
        if not running:
            return ScheduledBatch([], False, [])
        if self.config.decode_steps > 1:  # a burst, if the free blocks cover every sequence's lookahead
            steps = [min(self.config.decode_steps, s.params.max_tokens - s.num_completion_tokens) for s in running]
            if bm.try_append_all(running, steps):
                return ScheduledBatch(running, False, steps)
        if bm.try_append_all(running):  # one step for everyone: nobody is preempted
            return ScheduledBatch(running, False, [1] * len(running))
        if in_flight:  # a victim may still have tokens on the device: decide once they are read back
            return ScheduledBatch([], False, [])
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
        return ScheduledBatch(batch, False, [1] * len(batch))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ------------------------------------------------------------------ postprocess

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], logprobs: list[float]) -> list[Sequence]:
        """One sampled token per sequence: see ``postprocess_steps``."""
        if not len(seqs) == len(token_ids) == len(logprobs):
            raise RuntimeError(f"the model runner returned {len(token_ids)} tokens and {len(logprobs)} "
                               f"log-probs for {len(seqs)} sequences")
        return self.postprocess_steps(seqs, [[t] for t in token_ids], [[lp] for lp in logprobs])

    def postprocess_steps(self, seqs: list[Sequence], token_ids: list[list[int]],
                          logprobs: list[list[float]]) -> list[Sequence]:
        """Append each sequence's sampled tokens in order, up to the one that finishes it (the rest of its burst
        is dropped); return (and free) the sequences that finished. The tokens replace the sequence's oldest pending
        placeholders (those of a step launched later stay behind them; a finished sequence drops them too); a
        sequence finished meanwhile (aborted, or stopped by an earlier step) ignores them."""
        if not len(seqs) == len(token_ids) == len(logprobs):
            raise RuntimeError(f"the model runner returned tokens for {len(token_ids)} and log-probs for "
                               f"{len(logprobs)} of {len(seqs)} sequences")
        finished = []
        eos_ids = self.eos_ids
        for seq, tokens, lps in zip(seqs, token_ids, logprobs):
            if seq.is_finished:
                continue
            params = seq.params
            # Fast path, most sequences of most steps: nothing in this burst can finish them.
            known = seq.num_known_tokens - seq.num_prompt_tokens
            if (not params.stop and known + len(tokens) < params.max_tokens
                    and (params.ignore_eos or eos_ids.isdisjoint(tokens))):
                seq.add_tokens(tokens, lps)
                continue
            later = _later_pending(seq, len(tokens))  # the stop checks below read the completion's tail
            for token, logprob in zip(tokens, lps):
                seq.append_token(token, logprob)
                reason = self._finish_reason(seq, seq.token_ids[-1])
                if reason is not None:
                    seq.status = SequenceStatus.FINISHED
                    seq.finish_reason = reason
                    self.block_manager.register_finished(seq)
                    self.block_manager.deallocate(seq)
                    finished.append(seq)
                    break
            if later and not seq.is_finished:
                seq.add_pending(later)
        if finished:
            self.running = deque(s for s in self.running if not s.is_finished)
        return finished

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        eos = not params.ignore_eos and token in self.eos_ids
        length = seq.num_completion_tokens >= params.max_tokens
        if params.stop and self.decode is not None:
            if self._recent_stop(seq) or eos or length:
                if self._cut_at_stop(seq):
                    return "stop"
        if eos:
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


def _later_pending(seq: Sequence, arrived: int) -> int:
    """Drop ``seq``'s placeholders before ``arrived`` tokens of its oldest launched step are appended; returns how
    many belong to later steps (to be put back behind them)."""
    pending = seq.drop_pending()
    if pending and pending < arrived:
        raise RuntimeError(f"sequence {seq.seq_id} got {arrived} tokens for {pending} pending placeholders")
    return pending - arrived if pending else 0
