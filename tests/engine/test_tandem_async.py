"""Asynchronous scheduling of tandem bursts (engine.py): with writers drawn ahead (bernoulli, chunk, alternating) the
next burst is launched before the last one's tokens are read back, its first input fed on the device. The rollouts
are those of the synchronous engine and of the naive loop, token for token; rows that finish (EOS, max_tokens) while
a later burst is in flight, preemption, abort and sleep keep them so."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.step import DecodeStep
from tandemrl.engine.stopping import tokens_to_keep
from tandemrl.tandem.config import TandemConfig, owner_stream
from tandemrl.types import Request, Rollout
from tests.engine.test_model_runner import build
from tests.engine.test_tandem import DEVICE, WordTokenizer, engine_config, naive, requests

SELECTORS = [("bernoulli", 0.5), ("chunk", 0.5), ("alternating", 0.5)]
MAX_TOKENS = [9, 13, 17, 21, 25, 29]  # rows end at different bursts


@pytest.fixture(scope="module")
def models():
    return build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)


def varied(temperature: float = 0.0, ignore_eos: bool = False) -> list[Request]:
    reqs = requests(count=len(MAX_TOKENS), temperature=temperature)
    return [dataclasses.replace(r, params=dataclasses.replace(r.params, max_tokens=m, ignore_eos=ignore_eos))
            for r, m in zip(reqs, MAX_TOKENS)]


@dataclasses.dataclass
class Trace:
    """What the engine did: launches made while another step was in flight, tandem bursts that fed a pending token,
    empty plans for want of blocks while a step was in flight, rows finished by a step while a later step of theirs
    was in flight."""

    launches_in_flight: int = 0
    bursts_fed_pending: int = 0
    idle_in_flight: int = 0
    finished_in_flight: Counter = dataclasses.field(default_factory=Counter)  # finish reason -> rows


def traced(engine: LLMEngine) -> Trace:
    trace = Trace()
    launch, postprocess, schedule = engine.runner.launch, engine.scheduler.postprocess, engine.scheduler.schedule

    def traced_launch(plan):
        trace.launches_in_flight += engine._in_flight is not None
        trace.bursts_fed_pending += _burst(plan) is not None and any(s.num_pending for s in plan.seqs)
        return launch(plan)

    def traced_postprocess(plan, output, now=0.0):
        later = [s for s, n in zip(plan.seqs, plan.num_tokens) if not s.is_finished and s.num_pending > n]
        finished = postprocess(plan, output, now)
        trace.finished_in_flight.update(s.finish_reason for s in finished if s in later)
        return finished

    def traced_schedule(in_flight=False):
        plan = schedule(in_flight)
        trace.idle_in_flight += in_flight and not plan and engine.scheduler.has_unfinished()
        return plan

    engine.runner.launch, engine.scheduler.postprocess = traced_launch, traced_postprocess
    engine.scheduler.schedule = traced_schedule
    return trace


def run(hot, frozen, tandem: TandemConfig, reqs: list[Request], tokenizer=None,
        **cfg) -> tuple[list[Rollout], Trace, dict]:
    backend = EngineBackend(hot, tokenizer, engine_config(**{"decode_steps": 2, **cfg}), tandem=tandem,
                            frozen_model=frozen)
    trace = traced(backend.engine)
    out = backend.generate(reqs)
    stats = backend.engine.stats()
    assert stats["free_blocks"] == backend.engine.num_blocks  # every block back (cached ones are free too)
    backend.close()
    return out, trace, stats


def cut_at(eos: int, ids: list[int], writers: list[bool], logprobs: list[float]) -> tuple[list, list, list]:
    """A naive rollout (greedy, EOS ignored) as it ends with EOS on: after the first EOS."""
    end = ids.index(eos) + 1 if eos in ids else len(ids)
    return ids[:end], writers[:end], logprobs[:end]


def pick_eos(completions: list[list[int]]) -> int:
    """A token that ends the most rows strictly inside their completion (so rows end at different bursts)."""
    inside = Counter(t for ids in completions for t in set(ids[1:-1]) if ids.index(t) > 0)
    return min(inside, key=lambda t: (-inside[t], t))


def assert_same(a: list[Rollout], b: list[Rollout]) -> None:
    for x, y in zip(a, b):
        assert (x.completion_ids, x.token_sources, x.finish_reason) == (y.completion_ids, y.token_sources,
                                                                         y.finish_reason), x.request_id
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4), x.request_id


def test_drawn_ahead_selectors_schedule_asynchronously(models):
    hot, frozen = models
    for selector, synchronous in [("bernoulli", False), ("chunk", False), ("alternating", False), ("word", True),
                                  ("sentence", True)]:
        tokenizer = WordTokenizer() if synchronous else None
        if selector == "sentence":  # sentence boundaries: ids whose text ends with "."
            tokenizer.decode = lambda ids, skip_special_tokens=False: "".join("." if i % 7 == 0 else "a" for i in ids)
        backend = EngineBackend(hot, tokenizer, engine_config(), tandem=TandemConfig(enabled=True, selector=selector),
                                frozen_model=frozen)
        assert backend.engine._synchronous is synchronous, selector
        backend.close()
    backend = EngineBackend(hot, None, engine_config(async_scheduling=False), tandem=TandemConfig(enabled=True),
                            frozen_model=frozen)
    assert backend.engine._synchronous
    backend.close()


@pytest.mark.parametrize("selector, p", SELECTORS)
def test_greedy_async_bursts_equal_the_synchronous_engine_and_the_naive_loop_with_eos(selector, p, models):
    hot, frozen = models
    tandem = TandemConfig(enabled=True, selector=selector, p=p, chunk_tokens=3)
    reqs = varied()
    full = [naive(hot, frozen, tandem, r) for r in reqs]
    eos = pick_eos([ids for ids, _, _ in full])
    hot.generation_config.eos_token_id = eos
    try:
        out, trace, _ = run(hot, frozen, tandem, reqs)
        sync, sync_trace, _ = run(hot, frozen, tandem, reqs, async_scheduling=False)
    finally:
        hot.generation_config.eos_token_id = None
    for req, r, naive_out in zip(reqs, out, full):
        ids, writers, logprobs = cut_at(eos, *naive_out)
        assert (r.completion_ids, r.token_sources) == (ids, writers), req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
    assert_same(out, sync)
    reasons = Counter(r.finish_reason for r in out)
    assert reasons["stop"] >= 2 and reasons["length"] >= 1, reasons
    assert trace.launches_in_flight > 0 and trace.bursts_fed_pending > 0
    assert trace.finished_in_flight["stop"] >= 1  # EOS read back while the row's next burst was running
    assert sync_trace.launches_in_flight == sync_trace.bursts_fed_pending == 0


@pytest.mark.parametrize("selector, p", SELECTORS)
def test_seeded_sampled_async_bursts_equal_the_synchronous_engine(selector, p, models):
    """Rows end at their max_tokens, at different bursts: the async engine runs the same batches as the synchronous
    one, so each seeded stream draws the same noise."""
    hot, frozen = models
    tandem = TandemConfig(enabled=True, selector=selector, p=p, chunk_tokens=3)
    reqs = varied(temperature=1.0, ignore_eos=True)
    out, trace, _ = run(hot, frozen, tandem, reqs)
    sync, _, _ = run(hot, frozen, tandem, reqs, async_scheduling=False)
    assert_same(out, sync)
    assert [len(r.completion_ids) for r in out] == MAX_TOKENS
    assert any(not w for r in out for w in r.token_sources) and any(w for r in out for w in r.token_sources)
    assert trace.bursts_fed_pending > 0 and trace.finished_in_flight["length"] == 0  # none ran past max_tokens


def test_sampled_async_bursts_with_eos_keep_every_row_consistent(models):
    """With EOS on, a row that finishes inside a burst is still in the next one's batch (its tokens are dropped), so
    the seeded noise of the other rows differs from the synchronous engine's; each rollout must still be whole:
    its writers are its owner stream's, its log-probs the hot model's, EOS only at its end."""
    hot, frozen = models
    tandem = TandemConfig(enabled=True, p=0.5)
    reqs = varied(temperature=1.0)
    out, _, _ = run(hot, frozen, tandem, reqs, async_scheduling=False)
    eos = pick_eos([r.completion_ids for r in out])
    hot.generation_config.eos_token_id = eos
    try:
        out, trace, _ = run(hot, frozen, tandem, reqs)
    finally:
        hot.generation_config.eos_token_id = None
    assert trace.finished_in_flight["stop"] >= 1
    for req, r in zip(reqs, out):
        ids = r.completion_ids
        assert (eos in ids[:-1], r.finish_reason) == (False, "stop" if ids[-1] == eos else "length"), req.request_id
        assert len(ids) == req.params.max_tokens or ids[-1] == eos
        stream = owner_stream(tandem, req.request_id, req.params.seed)
        assert r.token_sources == stream.peek(len(ids)), req.request_id
        assert r.logprobs == pytest.approx(_hot_logprobs(hot, req, ids), abs=1e-4), req.request_id


@pytest.mark.parametrize("selector", ["bernoulli", "alternating"])
def test_preemption_with_async_bursts_keeps_the_rollouts(selector, models):
    hot, frozen = models
    tandem = TandemConfig(enabled=True, selector=selector, p=0.5)
    reqs = varied(ignore_eos=True)
    out, trace, stats = run(hot, frozen, tandem, reqs, num_blocks=24)
    sync, _, sync_stats = run(hot, frozen, tandem, reqs, num_blocks=24, async_scheduling=False)
    assert stats["preemptions"] > 0 and sync_stats["preemptions"] > 0
    assert trace.launches_in_flight > 0 and trace.idle_in_flight > 0  # short of blocks in flight: wait, then preempt
    for req, r in zip(reqs, out):
        ids, writers, logprobs = naive(hot, frozen, tandem, req)
        assert (r.completion_ids, r.token_sources) == (ids, writers), req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
    assert_same(out, sync)


def test_stop_strings_end_rows_with_a_burst_in_flight(models):
    hot, frozen = models
    tokenizer = WordTokenizer()  # every fifth id decodes to " w", the others to "a"
    tandem = TandemConfig(enabled=True, p=0.5)
    reqs = varied()
    full = [naive(hot, frozen, tandem, r) for r in reqs]
    texts = [tokenizer.decode(ids) for ids, _, _ in full]
    # the stop string that ends about half of the rows
    stop = min(["w w", "aaaa", "a wa", "w a w"], key=lambda s: abs(sum(s in t[:-2] for t in texts) - len(texts) / 2))
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, stop=(stop,))) for r in reqs]
    out, trace, _ = run(hot, frozen, tandem, reqs, tokenizer=tokenizer)
    sync, _, _ = run(hot, frozen, tandem, reqs, tokenizer=tokenizer, async_scheduling=False)
    assert_same(out, sync)
    for req, r, (ids, writers, logprobs) in zip(reqs, out, full):
        keep = tokens_to_keep(ids, tokenizer.decode, (stop,)) or len(ids)
        assert (r.completion_ids, r.token_sources) == (ids[:keep], writers[:keep]), req.request_id
        assert r.logprobs == pytest.approx(logprobs[:keep], abs=1e-4), req.request_id
        assert r.text == tokenizer.decode(ids[:keep]).split(stop)[0]
    assert {r.finish_reason for r in out} == {"stop", "length"}
    assert trace.finished_in_flight["stop"] >= 1


def test_abort_and_sleep_with_a_burst_in_flight(models):
    hot, frozen = models
    tandem = TandemConfig(enabled=True, p=0.5)
    reqs = varied(ignore_eos=True)
    backend = EngineBackend(hot, None, engine_config(decode_steps=2), tandem=tandem, frozen_model=frozen)
    done: dict[str, Rollout] = {}
    with backend.generating() as engine:
        for req in reqs:
            engine.add_request(req)
        for _ in range(3):
            done.update((r.request_id, r) for r in engine.step())
        in_flight = engine._in_flight
        assert in_flight is not None and _burst(in_flight.plan) is not None
        assert reqs[2].request_id in {s.request_id for s in in_flight.plan.seqs}
        assert engine.abort(reqs[2].request_id)
        engine.sleep()  # reads the burst in flight back, then every row is recomputed after wake()
        engine.wake()
        while engine.has_unfinished():
            done.update((r.request_id, r) for r in engine.step())
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    backend.close()
    assert sorted(done) == sorted(r.request_id for i, r in enumerate(reqs) if i != 2)
    for req in reqs:
        if req.request_id in done:
            ids, writers, logprobs = naive(hot, frozen, tandem, req)
            r = done[req.request_id]
            assert (r.completion_ids, r.token_sources) == (ids, writers), req.request_id
            assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id


def _hot_logprobs(hot, req: Request, completion: list[int]) -> list[float]:
    """The hot model's log-prob of each completion token at temperature 1, teacher-forced."""
    ids = torch.tensor([list(req.prompt_ids) + completion], device=hot.device)
    with torch.no_grad():
        logp = torch.log_softmax(hot(ids).logits[0, len(req.prompt_ids) - 1:-1].float(), -1)
    return logp.gather(-1, ids[0, len(req.prompt_ids):, None]).squeeze(-1).cpu().tolist()


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_paired_ticks_equal_the_naive_loop_and_run_the_frozen_slot_on_its_own_stream(p, models):
    """Paired ticks are the schedule on one GPU; forced here off a GPU too (issued in order there). On a GPU the
    frozen forwards run beside the hot ones on the frozen slot's capture stream: each slot's graphs keep their own
    cuBLAS workspace (kernels running at once must not share one)."""
    hot, frozen = models
    tandem = TandemConfig(enabled=True, p=p)
    reqs = varied(ignore_eos=True)
    backend = EngineBackend(hot, None, engine_config(decode_steps=4), tandem=tandem, frozen_model=frozen)
    engine = backend.engine
    assert engine.scheduler.paired_tandem == (DEVICE == "cuda")
    slots = engine.runner.slots
    if DEVICE == "cuda":
        assert len({id(slot.warmup_stream) for slot in slots.values()}) == len(slots)
    engine.scheduler.paired_tandem = True
    bursts = []
    launch = engine.runner.launch
    engine.runner.launch = lambda plan: (bursts.append(_burst(plan)), launch(plan))[1]
    out = backend.generate(reqs)
    backend.close()
    for req, r in zip(reqs, out):
        ids, writers, logprobs = naive(hot, frozen, tandem, req)
        assert (r.completion_ids, r.token_sources) == (ids, writers), req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
    assert any(f.beside for burst in bursts if burst is not None for f in burst.forwards)


def _burst(plan):
    """A plan's tandem burst (decode steps only have one)."""
    return plan.tandem if isinstance(plan, DecodeStep) else None
