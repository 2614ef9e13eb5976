"""Speculative decoding in the engine (draft model and n-gram proposals) against plain decoding: greedy tokens equal,
sampled tokens follow the target's distribution, and every request reports what was drafted and kept."""

from __future__ import annotations

import random
import weakref
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.model.cuda_graphs import DecodeGraphs
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.speculative import DRAFT
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.engine.step import TARGET
from tandemrl.types import Request, Rollout, SamplingParams
from tests.engine.test_model_runner import _EagerBody, _EagerGraph, _seeded_sample, build

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def config(**overrides) -> EngineConfig:
    return EngineConfig(**{"block_size": 4, "num_blocks": 256, "cuda_graphs": DEVICE == "cuda", **overrides})


def greedy_requests(seed: int = 0, count: int = 6, max_tokens: int = 14) -> list[Request]:
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [Request(f"r{i}", [rng.randrange(3, 128) for _ in range(3 + 4 * i)], params) for i in range(count)]


def generate(requests, draft=None, method=None, num_tokens=3, target=None, rounds=4, launches=None,
             **cfg) -> list[Rollout]:
    """The rollouts of ``requests``; ``launches``: a list that gets the number of steps the engine launched."""
    target = target if target is not None else build("qwen2", device=DEVICE)
    spec = SpeculativeConfig(method=method, num_tokens=num_tokens, rounds=rounds)
    backend = EngineBackend(target, None, config(**cfg), speculative=spec, draft_model=draft)
    out = backend.generate(requests)
    if launches is not None:
        launches.append(backend.engine.stats()["steps"])
    backend.close()
    return out


def check_counts(out: list[Rollout]) -> None:
    """Every verify step keeps its accepted proposals plus one token of the target's; every prefill (the first, and
    the one after each preemption) samples one token."""
    for r in out:
        s = r.stats
        assert 0 <= s.accepted_tokens <= s.drafted_tokens
        assert len(r.completion_ids) == 1 + s.preemptions + s.accepted_tokens + s.verify_steps, r.request_id


@pytest.mark.parametrize("num_tokens", [1, 3, 5])
def test_greedy_with_a_draft_model_equals_plain_decoding(num_tokens):
    requests = greedy_requests()
    plain = generate(requests)
    spec = generate(requests, draft=build("qwen2", seed=1, device=DEVICE), method="draft", num_tokens=num_tokens)
    assert [r.completion_ids for r in spec] == [r.completion_ids for r in plain]
    for mine, ref in zip(spec, plain):
        assert mine.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    check_counts(spec)
    assert sum(r.stats.drafted_tokens for r in spec) > 0


def test_verify_rounds_per_launch_give_plain_decoding_and_count_every_round():
    """Several verify rounds per launch (positions and KV slots computed on the device from the counts kept) give
    the tokens of plain decoding, one round at a time gives the same, and the stats count every round."""
    requests = greedy_requests(count=4, max_tokens=40)
    plain = generate(requests)
    draft = build("qwen2", seed=1, device=DEVICE)
    launches: list[int] = []
    by_rounds = {r: generate(requests, draft=draft, method="draft", rounds=r, launches=launches) for r in (1, 5)}
    for out in by_rounds.values():
        assert [r.completion_ids for r in out] == [r.completion_ids for r in plain]
        check_counts(out)
    one, five = by_rounds[1], by_rounds[5]
    assert [r.stats.acceptance_histogram for r in five] == [r.stats.acceptance_histogram for r in one]
    assert launches[1] < launches[0] / 2  # the host reads back once per launch


def test_the_target_as_its_own_draft_accepts_everything():
    target = build("qwen2", device=DEVICE)
    requests = greedy_requests()
    out = generate(requests, draft=target, method="draft", num_tokens=4, target=target)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in generate(requests, target=target)]
    assert all(r.stats.acceptance_rate == 1.0 for r in out)
    assert all(r.stats.acceptance_histogram[-1] == r.stats.verify_steps - 1 for r in out)  # the last step is short
    check_counts(out)


def test_an_always_wrong_draft_keeps_nothing_and_still_decodes_right():
    draft = build("qwen2", seed=1, device=DEVICE)
    with torch.no_grad():
        draft.lm_head.weight.zero_()  # every logit equal: the draft always proposes token 0
    requests = greedy_requests()
    plain = generate(requests)
    assert all(0 not in r.completion_ids for r in plain)  # so token 0 is always wrong
    out = generate(requests, draft=draft, method="draft", num_tokens=3)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in plain]
    assert all(r.stats.accepted_tokens == 0 and r.stats.drafted_tokens > 0 for r in out)
    check_counts(out)


def test_ngram_proposals_on_a_repetitive_prompt():
    phrase = [5, 17, 33, 2, 90, 41]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    requests = [Request(f"n{i}", phrase * (2 + i) + phrase[:3], params) for i in range(3)] + greedy_requests(count=2)
    plain = generate(requests)
    out = generate(requests, method="ngram", num_tokens=3)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in plain]
    assert sum(r.stats.drafted_tokens for r in out) > 0
    check_counts(out)


def test_stats_survive_preemption():
    requests = greedy_requests(count=6, max_tokens=20)
    plain = generate(requests)
    out = generate(requests, draft=build("qwen2", seed=1, device=DEVICE), method="draft", num_tokens=3, num_blocks=20)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in plain]
    assert sum(r.stats.preemptions for r in out) > 0
    check_counts(out)  # counts from before a preemption are kept: they still add up to the whole completion


def test_sampled_tokens_follow_the_target_distribution():
    """The token a verify step produces (an accepted proposal, or the target's own) is distributed as the target's
    next-token distribution: chi-square over the second token, given the most frequent first one."""
    target, draft = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    with torch.no_grad():  # sharper distributions than a random model's, so a few thousand samples tell
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)
    prompt = [7, 21, 99, 4, 60]
    params = SamplingParams(max_tokens=3, temperature=1.0, ignore_eos=True, seed=123)  # one proposal for token 2
    requests = [Request(f"s{i}", prompt, params) for i in range(4000)]
    out = generate(requests, draft=draft, method="draft", num_tokens=2, target=target, num_blocks=4096)
    first = Counter(r.completion_ids[0] for r in out).most_common(1)[0][0]
    seconds = [r.completion_ids[1] for r in out if r.completion_ids[0] == first]
    assert len(seconds) > 300 and sum(r.stats.accepted_tokens for r in out) > 0
    with torch.no_grad():
        logits = target(torch.tensor([prompt + [first]], device=DEVICE)).logits[0, -1].float()
    expected = torch.softmax(logits, -1).cpu().double()
    observed, probs = _bucket(Counter(seconds), expected, min_expected=5.0, total=len(seconds))
    assert chisquare(observed, probs * len(seconds)).pvalue > 1e-3


def _bucket(counts: Counter, probs: torch.Tensor, min_expected: float, total: int) -> tuple[list[float], torch.Tensor]:
    """Tokens expected at least ``min_expected`` times each keep their own cell; the rest share one."""
    big = [t for t in range(len(probs)) if probs[t] * total >= min_expected]
    rest = [t for t in range(len(probs)) if t not in set(big)]
    observed = [counts.get(t, 0) for t in big] + [sum(counts.get(t, 0) for t in rest)]
    expected = torch.cat([probs[big], probs[rest].sum().reshape(1)])
    return [float(x) for x in observed], expected / expected.sum()


def test_speculative_configuration_errors_are_clear():
    target = build("qwen2", device=DEVICE)
    with pytest.raises(ValueError, match="needs a draft model"):
        EngineBackend(target, None, config(), speculative=SpeculativeConfig(method="draft"))
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 1"):
        EngineBackend(target, None, config(), speculative=SpeculativeConfig(method="ngram", num_tokens=0))
    other_vocab = build("llama", device=DEVICE)
    other_vocab.resize_token_embeddings(96)
    with pytest.raises(ValueError, match="share a vocabulary"):
        EngineBackend(target, None, config(), speculative=SpeculativeConfig(method="draft"), draft_model=other_vocab)
    filtered = SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9)
    out = generate([Request("p", [5, 6, 7], filtered)], method="ngram", target=target)
    assert out[0].finish_reason == "error" and "top_k and top_p are not supported" in out[0].error


@pytest.mark.skipif(DEVICE == "cuda", reason="stands the CUDA graphs in on the CPU (the GPU runs the real ones above)")
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verify_rounds_through_graphs_equal_eager_forwards(monkeypatch, temperature):
    """The verify rounds' forwards through the graphs (inputs computed on the device and copied into the graphs'
    static buffer: ModelSlot.column_forward; the graphs and the fused sampler stood in on the CPU) give the rollouts
    of the eager forwards with the same seeds."""
    monkeypatch.setattr(DecodeGraphs, "capture", lambda self, body: ((g := _EagerBody(body)), g.out))
    monkeypatch.setattr(DecodeGraphs, "_capture", lambda self, *key: ((g := _EagerGraph(self, *key)), g.out))
    monkeypatch.setattr("tandemrl.engine.model.step_sampler.fused_sample", _seeded_sample)
    monkeypatch.setattr("tandemrl.engine.model.step_sampler.fused_sample_available", lambda device: True)
    target, draft = build("qwen2"), build("qwen2", seed=1)
    params = SamplingParams(max_tokens=20, temperature=temperature, ignore_eos=True, seed=7)
    requests = [Request(r.request_id, r.prompt_ids, params) for r in greedy_requests(count=5)]

    def rollouts(graphed: bool) -> list[list[int]]:
        runner = ModelRunner({TARGET: target, DRAFT: draft}, config(), "cpu")
        for slot in runner.slots.values():
            slot.enforce_eager = not graphed
        for sampler in runner._samplers.values():
            sampler.fused_kernels = True
        engine = LLMEngine(runner, None, config(), eos_ids=[],
                           speculative=SpeculativeConfig(method="draft", num_tokens=4).for_engine())
        return [r.completion_ids for r in engine.generate(requests)]

    graphed = rollouts(True)
    assert graphed == rollouts(False)
    if temperature == 0.0:
        assert graphed == [r.completion_ids for r in generate(requests, target=target)]


class _WeakEagerBody(_EagerBody):
    """An eager stand-in for a captured round that, as a CUDA graph, keeps nothing of what it reads alive: a replay
    after its body (and the tensors the body reads) was freed fails here as the real graph would read freed memory."""

    def __init__(self, body) -> None:
        super().__init__(body)
        self.body = weakref.ref(body)

    def replay(self) -> None:
        body = self.body()
        assert body is not None, "a round graph's inputs were freed after its capture"
        for mine, new in zip(self.out, body()):
            mine.copy_(new)


def _graphed_runner(monkeypatch, target, draft, **cfg) -> ModelRunner:
    """A runner whose slots use CUDA graphs; on the CPU eager stand-ins of them (forwards and whole rounds)."""
    if DEVICE == "cpu":
        monkeypatch.setattr(DecodeGraphs, "_capture", lambda self, *key: ((g := _EagerGraph(self, *key)), g.out))
        monkeypatch.setattr(DecodeGraphs, "capture", lambda self, body: ((g := _WeakEagerBody(body)), g.out))
        monkeypatch.setattr("tandemrl.engine.model.step_sampler.fused_sample", _seeded_sample)
        monkeypatch.setattr("tandemrl.engine.model.step_sampler.fused_sample_available", lambda device: True)
    runner = ModelRunner({TARGET: target, DRAFT: draft}, config(**cfg), DEVICE)
    for slot in runner.slots.values():
        slot.enforce_eager = False
    return runner


def test_greedy_rounds_run_as_one_graph_each_and_decode_as_plain_decoding(monkeypatch):
    """Greedy rows: every verify round is one replay of a round graph (5 rows padded to the bucket of 8 with dead
    rows, which write only the scratch block), and the tokens are plain decoding's."""
    target, draft = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    requests = greedy_requests(count=5, max_tokens=30)
    runner = _graphed_runner(monkeypatch, target, draft)
    engine = LLMEngine(runner, None, config(), eos_ids=[],
                       speculative=SpeculativeConfig(method="draft", num_tokens=4).for_engine())
    out = engine.generate(requests)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in generate(requests, target=target)]
    check_counts(out)
    assert {bucket for bucket, *_ in runner.slots[TARGET].decode_graphs().rounds} == {8}
    assert sum(r.stats.drafted_tokens for r in out) > 0


def test_greedy_ngram_rounds_run_as_one_graph_each_and_decode_as_plain_decoding(monkeypatch):
    """The host proposer's greedy rounds replay a round graph too (its proposals loaded with the launch), keyed by
    proposer and rule; the tokens are plain decoding's."""
    target = build("qwen2", device=DEVICE)
    phrase = [5, 17, 33, 2, 90, 41]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    requests = [Request(f"n{i}", phrase * (2 + i) + phrase[:3], params) for i in range(3)] + greedy_requests(count=2)
    runner = _graphed_runner(monkeypatch, target, build("qwen2", seed=1, device=DEVICE))
    engine = LLMEngine(runner, None, config(), eos_ids=[],
                       speculative=SpeculativeConfig(method="ngram", num_tokens=3).for_engine())
    out = engine.generate(requests)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in generate(requests, target=target)]
    check_counts(out)
    assert {(proposer, rule) for *_, proposer, rule in runner.slots[TARGET].decode_graphs().rounds} == {
        ("host", "rejection")}
    assert sum(r.stats.accepted_tokens for r in out) > 0


def test_sampled_verify_forwards_past_the_largest_decode_bucket_run_in_a_graph(monkeypatch):
    """64 sampled sequences x (4 + 1) = 320 verify rows, past the largest decode bucket (256): the verify forward
    still runs in a CUDA graph (the 512 bucket; on the CPU an eager stand-in), and on the CPU its rollouts are the
    eager forwards' with the same seeds."""
    target, draft = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    params = SamplingParams(max_tokens=6, temperature=0.9, ignore_eos=True, seed=3)
    requests = [Request(f"{i}-{r.request_id}", r.prompt_ids, params) for i in range(4)
                for r in greedy_requests(count=16)]

    def rollouts(graphed: bool) -> list[list[int]]:
        runner = _graphed_runner(monkeypatch, target, draft, num_blocks=512)
        for slot in runner.slots.values():
            slot.enforce_eager = not graphed
        engine = LLMEngine(runner, None, config(num_blocks=512), eos_ids=[],
                           speculative=SpeculativeConfig(method="draft", num_tokens=4).for_engine())
        out = [r.completion_ids for r in engine.generate(requests)]
        if graphed:
            assert 512 in {bucket for bucket, _, _ in runner.slots[TARGET].decode_graphs().graphs}
        return out

    graphed = rollouts(True)
    assert all(len(tokens) == 6 for tokens in graphed)
    if DEVICE == "cpu":
        assert graphed == rollouts(False)
