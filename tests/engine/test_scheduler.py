"""Scheduler: prefill admission (token budget, max_num_seqs, blocks), decode, preemption, finishing."""

from __future__ import annotations

import itertools

import pytest

from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.scheduler import Scheduler
from tandemrl.engine.sequence import Sequence, SequenceStatus
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.engine.step import DecodeStep, StepKind, StepOutput
from tandemrl.types import SamplingParams

BS = 4
EOS = 0
_ids = itertools.count()


def make(num_blocks=16, caching=True, decode=None, **cfg) -> Scheduler:
    cfg.setdefault("decode_steps", 1)  # one token per decode step unless a test asks for bursts
    config = EngineConfig(block_size=BS, num_blocks=num_blocks, enable_prefix_caching=caching, **cfg)
    return Scheduler(config, BlockManager(num_blocks, BS, caching), [EOS], decode=decode)


def schedule(s: Scheduler) -> tuple[list[Sequence], bool]:
    plan = s.schedule()
    assert len(plan.num_tokens) == len(plan.seqs)
    return plan.seqs, plan.is_prefill


def post_steps(s: Scheduler, seqs: list[Sequence], tokens: list[list[int]], logprobs: list[list[float]],
               planned: list[int] | None = None) -> list[Sequence]:
    """The engine's side of a step: reserve each row's planned placeholders, then postprocess what came back."""
    planned = planned or [len(t) for t in tokens]
    for x, n in zip(seqs, planned):
        x.add_pending(n)
    return s.postprocess(DecodeStep(seqs, planned), StepOutput(tokens, logprobs))


def post(s: Scheduler, seqs: list[Sequence], tokens: list[int], logprobs: list[float]) -> list[Sequence]:
    return post_steps(s, seqs, [[t] for t in tokens], [[lp] for lp in logprobs])


def seq(tokens, **params) -> Sequence:
    params.setdefault("max_tokens", 8)
    return Sequence(next(_ids), f"r{len(tokens)}", list(tokens), len(tokens), SamplingParams(**params))


def test_prefill_respects_token_budget_but_always_admits_one():
    s = make(max_num_batched_tokens=10, max_num_seqs=4)
    seqs = [seq(range(1, 7)), seq(range(11, 17)), seq(range(21, 41), max_tokens=4)]
    for x in seqs:
        s.add(x)
    batch, prefill = schedule(s)
    assert prefill and batch == seqs[:1]  # 6 + 6 > 10
    assert schedule(s) == ([seqs[1]], True)
    assert schedule(s) == ([seqs[2]], True)  # 20 tokens > budget, admitted alone
    assert all(x.status is SequenceStatus.RUNNING for x in seqs)


def test_budget_counts_only_tokens_to_compute():
    prompt = list(range(1, 9))  # 8 tokens: the first block can be shared (the last one holds the last token)
    s = make(max_num_batched_tokens=12)
    seqs = [seq(prompt) for _ in range(3)]
    for x in seqs:
        s.add(x)
    batch, _ = schedule(s)
    assert batch == seqs[:2]  # 8 + 4 computed; a third would make 16
    off = make(caching=False, max_num_batched_tokens=12)
    for x in [seq(prompt) for _ in range(3)]:
        off.add(x)
    assert len(schedule(off)[0]) == 1


def test_max_num_seqs_caps_running():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add(seq([i + 1, 5]))
    assert len(schedule(s)[0]) == 2
    batch, prefill = schedule(s)
    assert not prefill and len(batch) == 2 and len(s.waiting) == 1


def test_decode_gives_blocks_and_schedules_all_running():
    s = make()
    a = seq([1, 2, 3, 4])
    s.add(a)
    schedule(s)
    post(s, [a], [7], [-0.5])
    batch, prefill = schedule(s)
    assert batch == [a] and not prefill and len(a.block_table) == 2


def test_preemption_evicts_the_most_recent_and_requeues_it_first():
    s = make(num_blocks=4)
    old, mid, new = seq([1, 2, 3, 4]), seq([5, 6, 7, 8]), seq([9, 10, 11, 12])
    for x in (old, mid, new):
        s.add(x)
    assert schedule(s) == ([old, mid, new], True)  # 3 of 4 blocks
    post(s, [old, mid, new], [1, 1, 1], [-1.0] * 3)  # each now needs a second block; one is free
    batch, prefill = schedule(s)
    assert not prefill and batch == [old, mid]  # old takes the free block, mid takes new's
    assert list(s.waiting) == [new] and s.num_preemptions == 1
    assert new.status is SequenceStatus.WAITING and new.block_table == [] and new.num_tokens == 5


def test_victims_return_to_the_front_of_waiting_oldest_first():
    s = make(num_blocks=4, max_num_seqs=4)
    seqs = [seq([i, i, i, i]) for i in range(1, 5)]  # 4 blocks: the whole pool
    for x in seqs:
        s.add(x)
    late = seq([9])
    s.add(late)  # waits: max_num_seqs and the pool are full
    assert schedule(s) == (seqs, True)
    post(s, seqs, [1] * 4, [-1.0] * 4)  # all four need a block; none free
    batch, _ = schedule(s)
    assert batch == seqs[:2]  # seqs[0] evicts seqs[3], seqs[1] evicts seqs[2]
    assert list(s.waiting) == [seqs[2], seqs[3], late]


def test_preempted_sequence_recomputes_with_its_generated_tokens():
    s = make(num_blocks=3)
    a, b = seq([1, 2, 3, 4], max_tokens=5), seq([5, 6, 7, 8], max_tokens=5)
    s.add(a)
    s.add(b)
    schedule(s)
    post(s, [a, b], [9, 9], [-1.0, -1.0])
    batch, _ = schedule(s)  # a takes the last block; b is preempted
    assert batch == [a] and list(s.waiting) == [b]
    post(s, [a], [3], [-1.0])
    s.abort(a)  # a leaves; b comes back as a prefill of its prompt + generated tokens
    batch, prefill = schedule(s)
    assert prefill and batch == [b] and b.token_ids == [5, 6, 7, 8, 9] and b.num_cached_tokens == 4


def test_postprocess_finish_reasons():
    s = make()
    eos, length, cont, ign = seq([1, 2]), seq([3, 4], max_tokens=1), seq([5, 6]), seq([7, 8], ignore_eos=True)
    for x in (eos, length, cont, ign):
        s.add(x)
    batch, _ = schedule(s)
    done = post(s, batch, [EOS, 9, 9, EOS], [-1.0] * 4)
    assert done == [eos, length]
    assert (eos.finish_reason, length.finish_reason) == ("stop", "length")
    assert eos.block_table == [] and list(s.running) == [cont, ign]
    assert s.block_manager.num_free_blocks == 16 - 2


def test_stop_string_keeps_the_completing_token():
    decode = lambda ids: "".join("abcdefghij"[i % 10] for i in ids)  # noqa: E731
    s = make(decode=decode)
    x = seq([1], stop=("cd",), max_tokens=10)
    s.add(x)
    for tok in (2, 3):  # "c" then "d": the second token completes "cd"
        batch, _ = schedule(s)
        done = post(s, batch, [tok], [-1.0])
    assert done == [x] and x.finish_reason == "stop" and x.completion_ids == [2, 3]


def test_stop_found_late_is_cut_back_at_finish():
    decode = lambda ids: "".join("abcdefghij"[i % 10] for i in ids)  # noqa: E731
    s = make(decode=decode)
    x = seq([1], stop=("bcd",), max_tokens=3)
    s.add(x)
    # Append tokens without checks, as if the window had missed the stop string, then finish by length.
    x.token_ids += [1, 2]
    x.logprobs += [-1.0, -1.0]
    schedule(s)
    done = post(s, [x], [3], [-2.0])
    assert done == [x] and x.finish_reason == "stop" and x.completion_ids == [1, 2, 3]


def test_requests_that_can_never_fit_are_rejected():
    s = make(num_blocks=2, max_model_len=20)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add(seq(range(1, 16), max_tokens=6))
    with pytest.raises(ValueError, match="KV blocks"):
        s.add(seq(range(1, 6), max_tokens=5))  # 9 tokens need K/V: 3 blocks of 4
    s.add(seq(range(1, 6), max_tokens=4))  # 8 tokens need K/V: exactly the pool
    with pytest.raises(ValueError, match="tokenizer"):
        s.add(seq([1], stop=("x",)))


def test_postprocess_length_mismatch_is_an_error():
    s = make()
    a = seq([1])
    s.add(a)
    batch, _ = schedule(s)
    with pytest.raises(RuntimeError, match="returned tokens for 0 and log-probs for 0 of 1 rows"):
        s.postprocess(DecodeStep(batch, [1]), StepOutput([], []))


def test_decode_bursts_reserve_blocks_ahead_and_stop_at_max_tokens():
    s = make(decode_steps=6)
    a, b = seq([1, 2, 3], max_tokens=9), seq([4, 5], max_tokens=3)
    s.add(a)
    s.add(b)
    s.schedule()
    post(s, [a, b], [7, 7], [-1.0, -1.0])
    batch = s.schedule()
    assert not batch.is_prefill and batch.num_tokens == [6, 2]  # b has 2 tokens left
    # a writes positions 3..8 (blocks 0-2), b positions 2..3 (block 0)
    assert (len(a.block_table), len(b.block_table)) == (3, 1)
    done = post_steps(s, batch.seqs, [[1] * 6, [2, EOS]], [[-1.0] * 6, [-1.0, -2.0]])
    assert done == [b] and b.completion_ids == [7, 2, EOS] and b.finish_reason == "stop"
    assert a.num_completion_tokens == 7 and list(s.running) == [a]
    assert s.schedule().num_tokens == [2]


def test_a_burst_drops_the_tokens_after_a_finish_and_falls_back_to_single_steps_when_blocks_run_out():
    s = make(num_blocks=3, decode_steps=8)
    a = seq([1, 2, 3, 4, 5], max_tokens=7)
    s.add(a)
    s.schedule()
    post(s, [a], [9], [-1.0])
    batch = s.schedule()
    assert batch.num_tokens == [6] and len(a.block_table) == 3  # positions 5..10
    done = post_steps(s, [a], [[9, EOS, 9, 9, 9, 9]], [[-1.0] * 6])
    assert done == [a] and a.completion_ids == [9, 9, EOS] and len(a.logprobs) == 3
    assert s.block_manager.num_free_blocks == 3
    c, d = seq([1, 2, 3], max_tokens=6), seq([5, 6, 7], max_tokens=6)
    s.add(c)
    s.add(d)
    s.schedule()
    post(s, [c, d], [1, 1], [-1.0, -1.0])
    batch = s.schedule()  # bursts need one more block each, one is free; single steps fit
    assert batch.num_tokens == [1, 1] and s.num_preemptions == 0


def test_draft_rounds_halve_until_their_blocks_fit():
    """A launch of draft rounds reserves blocks for every proposal kept; when the free blocks cannot cover the rounds
    planned, half as many are tried, and so on down to one (not straight to one)."""
    config = EngineConfig(block_size=BS, num_blocks=16, decode_steps=1)
    s = Scheduler(config, BlockManager(16, BS, True), [EOS],
                  speculative=SpeculativeConfig(method="draft", num_tokens=2, rounds=16).for_engine())
    a, b = seq([1, 2, 3], max_tokens=40), seq([4, 5, 6], max_tokens=40)
    s.add(a)
    s.add(b)
    s.schedule()
    post(s, [a, b], [7, 7], [-1.0, -1.0])  # 4 tokens (one block) each, 39 left: 13 rounds of k + 1 = 3 tokens
    plan = s.schedule()
    # 13 rounds would need 10 more blocks each (20 > the 14 free); 6 rounds (18 tokens) need 5 each
    assert plan.kind == StepKind.VERIFY and plan.rounds == 6 and plan.num_tokens == [18, 18]
    assert [len(x.block_table) for x in (a, b)] == [6, 6]
