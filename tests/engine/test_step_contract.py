"""The engine's step contract (step.py): verify steps on the real runner against Hugging Face greedy, model slots,
rows that return fewer or more tokens than planned, and the per-request stats."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.step import DecodeStep, PrefillStep, StepOutput, StepPlan, VerifyStep
from tandemrl.types import Request, SamplingParams
from tests.engine.test_engine_core import BS, EOS, FakeRunner, FakeTokenizer, assert_matches_reference, make_engine, prompt, req
from tests.engine.test_model_runner import BLOCK, COMMON, Blocks, build, hf_greedy, make_seq, prompts_of

# ---------------------------------------------------------------------- verify on the real runner


def _prefilled(runner: ModelRunner, prompts: list[list[int]], blocks: Blocks):
    seqs = [make_seq(i, p, blocks.take(4)) for i, p in enumerate(prompts)]  # 64 slots: room for the feed
    tokens, logprobs = runner.run(seqs, True)
    for seq, t, lp in zip(seqs, tokens, logprobs):
        seq.append_token(t, lp)
    return seqs


def test_verify_keeps_the_feed_up_to_the_first_disagreement_and_matches_hf():
    model = build("qwen2")
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK, cuda_graphs=False), "cpu")
    runner.allocate_kv_cache(64)
    prompts = prompts_of([5, 9, 12])
    refs = [hf_greedy(model, p, 8) for p in prompts]
    seqs = _prefilled(runner, prompts, Blocks(64))
    wrong = lambda t: (t + 1) % 128  # noqa: E731
    ids = [r[0] for r in refs]
    feed = [ids[0][1:5],  # all right: 4 kept, plus the model's next token
            [ids[1][1], wrong(ids[1][2]), ids[1][3]],  # one kept, the second replaced by the model's token
            [wrong(ids[2][1])]]  # none kept
    plan = VerifyStep(seqs, [len(f) + 1 for f in feed], proposer="host", feed=feed)
    out = runner.launch(plan).result()
    assert out.num_accepted == [[4], [1], [0]]
    assert out.token_ids == [ids[0][1:6], ids[1][1:3], ids[2][1:2]]
    for (_, ref_lps), got, n in zip(refs, out.logprobs, [5, 2, 1]):
        assert got == pytest.approx(ref_lps[1:1 + n], abs=1e-4)
    # The rejected positions' K/V is overwritten by the decode that follows: the rest still equals HF.
    for seq, tokens, lps in zip(seqs, out.token_ids, out.logprobs):
        for t, lp in zip(tokens, lps):
            seq.append_token(t, lp)
    while min(len(s.completion_ids) for s in seqs) < 8:
        live = [s for s in seqs if len(s.completion_ids) < 8]
        tokens, logprobs = runner.run(live, False)
        for seq, t, lp in zip(live, tokens, logprobs):
            seq.append_token(t, lp)
    assert [s.completion_ids[:8] for s in seqs] == [r[0] for r in refs]


def test_verify_sampling_keeps_only_what_the_target_would_sample():
    """With sampling, a kept feed token is one the target sampled there: feeding the target's own seeded samples
    back is accepted in full, and the bonus token is a fresh sample."""
    model = build("qwen2")
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK, cuda_graphs=False), "cpu")
    runner.allocate_kv_cache(64)
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
    seq = make_seq(0, prompts_of([6])[0], Blocks(64).take(4), params)
    tokens, lps = runner.run([seq], True)
    seq.append_token(tokens[0], lps[0])
    out = runner.launch(VerifyStep([seq], [4], proposer="host", feed=[[5, 5, 5]])).result()
    accepted = out.num_accepted[0][0]
    assert len(out.token_ids[0]) == accepted + 1 and out.token_ids[0][:accepted] == [5] * accepted
    assert all(lp <= 0 for lp in out.logprobs[0])


# ---------------------------------------------------------------------- model slots


def test_runner_hosts_several_model_slots_each_with_its_own_pool():
    target, draft = build("qwen2", seed=0), build("qwen3", seed=1)
    runner = ModelRunner({"target": target, "draft": draft}, EngineConfig(block_size=BLOCK, cuda_graphs=False), "cpu")
    assert runner.bytes_per_block() == runner.slots["target"].bytes_per_block() + runner.slots["draft"].bytes_per_block()
    runner.allocate_kv_cache(16)
    assert all(slot.num_blocks == 16 and slot.k_caches for slot in runner.slots.values())
    prompt_ids = prompts_of([7])[0]
    for name, model in (("draft", draft), ("target", target)):
        seq = make_seq(0, prompt_ids, [3])
        out = runner.launch(PrefillStep([seq], [1], slot=name)).result()
        assert out.token_ids == [[hf_greedy(model, prompt_ids, 1)[0][0]]], name
    with pytest.raises(ValueError, match="no model slot 'frozen'"):
        runner.launch(PrefillStep([make_seq(1, prompt_ids, [4])], [1], slot="frozen"))
    runner.free_kv_cache()
    assert not any(slot.k_caches for slot in runner.slots.values())


def test_model_slots_must_share_a_vocabulary():
    other = Qwen2ForCausalLM(Qwen2Config(**{**COMMON, "vocab_size": 96}))
    with pytest.raises(ValueError, match=r"share a vocabulary.*'target': 128.*'draft': 96"):
        ModelRunner({"target": build("qwen2"), "draft": other}, EngineConfig(block_size=BLOCK), "cpu")
    with pytest.raises(ValueError, match="'target' slot"):
        ModelRunner({"draft": build("qwen2")}, EngineConfig(block_size=BLOCK), "cpu")


def test_step_plans_check_their_rows():
    with pytest.raises(ValueError, match="one token count per row"):
        DecodeStep([], [1])
    with pytest.raises(ValueError, match="len\\(feed\\) \\+ 1"):
        VerifyStep([make_seq(0, [1, 2], [0])], [2], proposer="host", feed=[[4, 5]])


# ---------------------------------------------------------------------- rows that return fewer or more tokens


class ShortRunner(FakeRunner):
    """Computes every planned token but returns one fewer for each decode row of more than one (as a verify step
    that rejects its last draft would): the next step recomputes from the last kept token."""

    def launch(self, plan: StepPlan):
        pending = super().launch(plan)
        if not plan.is_prefill:
            pending.tokens = [t[:-1] if len(t) > 1 else t for t in pending.tokens]
        return pending


def test_rows_returning_fewer_tokens_than_planned_continue_correctly():
    runner = ShortRunner()
    engine = LLMEngine(runner, FakeTokenizer(), EngineConfig(block_size=BS, num_blocks=64, decode_steps=4,
                                                             async_scheduling=False), [EOS])
    runner.live = lambda: engine.scheduler.running
    requests = [req(f"r{n}", prompt(n, base=n), max_tokens=13, seed=n) for n in (3, 6, 9)]
    out = engine.generate(requests)
    assert_matches_reference(requests, out)
    assert engine.stats()["decode_tokens"] > sum(len(r.completion_ids) for r in out)  # some were dropped
    assert engine.block_manager.num_free_blocks == 64


def test_a_changed_count_with_a_later_step_in_flight_is_an_error():
    runner = ShortRunner()
    engine = LLMEngine(runner, None, EngineConfig(block_size=BS, num_blocks=64, decode_steps=4), [EOS])
    with pytest.raises(RuntimeError, match="while a later step is in flight"):
        engine.generate([req("a", prompt(5), max_tokens=30)])


def _running(engine: LLMEngine, max_tokens: int, planned: int, **params):
    seq_id = engine._add(Request("m", prompt(4), SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)),
                         0)[0]
    seq = engine._live[seq_id]
    seq.add_pending(planned)
    engine.scheduler.running.append(seq)
    return seq


def test_rows_returning_more_tokens_than_planned():
    """A step that writes a run (e.g. a frozen model's) returns more tokens than the placeholders it reserved; past
    max_tokens they are dropped and the sequence finishes."""
    engine, _ = make_engine()
    seq = _running(engine, max_tokens=20, planned=1)
    plan = DecodeStep([seq], [1])
    assert not engine.scheduler.postprocess(plan, StepOutput([[7, 8, 9]], [[-1.0, -2.0, -3.0]]))
    assert seq.completion_ids == [7, 8, 9] and seq.logprobs == [-1.0, -2.0, -3.0] and seq.num_pending == 0
    short = _running(engine, max_tokens=2, planned=1)
    done = engine.scheduler.postprocess(DecodeStep([short], [1]), StepOutput([[7, 8, 9]], [[-1.0] * 3]))
    assert done == [short] and short.completion_ids == [7, 8] and short.finish_reason == "length"


# ---------------------------------------------------------------------- request stats


def test_request_stats_record_times_tokens_cache_hits_and_blocks():
    clock = itertools.count(1.0)
    runner = FakeRunner()
    engine = LLMEngine(runner, None, EngineConfig(block_size=BS, num_blocks=64, decode_steps=4), [EOS],
                       clock=lambda: float(next(clock)))
    runner.live = lambda: engine.scheduler.running
    group = [req(f"g{j}", prompt(13), max_tokens=10, seed=j) for j in range(3)]
    out = engine.generate(group)
    for r in out:
        s = r.stats
        assert s.arrival_time < s.first_scheduled_time < s.first_token_time < s.finished_time
        assert s.latency == s.finished_time - s.arrival_time and s.queue_time > 0 and s.time_to_first_token > 0
        assert (s.prompt_tokens, s.generated_tokens) == (13, 10)
        assert s.peak_kv_blocks == -(-(13 + 10 - 1) // BS) and s.kv_blocks == 0
        assert s.peak_kv_mb == s.peak_kv_blocks * 1024 / 2**20 and s.preemptions == 0
        assert (s.drafted_tokens, s.accepted_tokens, s.acceptance_rate) == (0, 0, 0.0)
    assert [r.stats.cached_prompt_tokens for r in out] == [0, 12, 12]  # the later samples share 3 full blocks
    assert out[1].stats.cache_hit_ratio == pytest.approx(12 / 13)


def test_request_stats_count_preemptions():
    engine, _ = make_engine(num_blocks=10)
    out = engine.generate([req(f"p{i}", prompt(5 + i, base=i), max_tokens=18) for i in range(7)])
    assert sum(r.stats.preemptions for r in out) == engine.stats()["preemptions"] > 0


def test_verify_outputs_count_drafted_and_accepted_tokens():
    engine, _ = make_engine()
    seq_id = engine._add(Request("v", prompt(4), SamplingParams(max_tokens=20, ignore_eos=True)), 0)[0]
    seq = engine._live[seq_id]
    seq.add_pending(4)
    engine.scheduler.running.append(seq)
    plan = VerifyStep([seq], [4], proposer="host", feed=[[7, 8, 9]])
    engine.scheduler.postprocess(plan, StepOutput([[7, 8]], [[-0.5, -0.25]], num_accepted=[[1]]), now=2.0)
    assert seq.completion_ids == [7, 8] and seq.num_pending == 0
    assert (seq.stats.drafted_tokens, seq.stats.accepted_tokens, seq.stats.acceptance_rate) == (3, 1, 1 / 3)
    assert seq.stats.acceptance_histogram == [0, 1] and seq.stats.mean_accepted_length == 2.0


def test_verify_rounds_count_each_kept_round_with_what_it_drafted():
    """A launch of draft rounds: each round drafts min(k, what is left of the row's budget - 1); the telemetry counts
    the rounds whose tokens the sequence kept, and none after an EOS inside the launch."""
    engine, _ = make_engine()

    def postprocess(params: SamplingParams, tokens: list[int]):
        seq = engine._live[engine._add(Request("v", prompt(4), params), 0)[0]]
        seq.add_pending(6)
        engine.scheduler.running.append(seq)
        plan = VerifyStep([seq], [6], rounds=3, num_proposals=2)
        output = StepOutput([tokens], [[-0.5] * len(tokens)], num_accepted=[[2, 0, 1]])
        engine.scheduler.postprocess(plan, output, now=1.0)
        return seq

    seq = postprocess(SamplingParams(max_tokens=20, ignore_eos=True), [7, 8, 9, 10, 11, 12])  # rounds of 3, 1, 2
    assert seq.completion_ids == [7, 8, 9, 10, 11, 12]
    assert (seq.stats.drafted_tokens, seq.stats.accepted_tokens) == (2 + 2 + 1, 3)  # the last round had 2 left
    assert seq.stats.acceptance_histogram == [1, 1, 1]
    seq = postprocess(SamplingParams(max_tokens=20), [7, EOS, 9, 10, 11, 12])  # EOS ends it in the first round
    assert seq.completion_ids == [7, EOS] and seq.is_finished
    assert (seq.stats.drafted_tokens, seq.stats.accepted_tokens, seq.stats.acceptance_histogram) == (2, 2, [0, 0, 1])
