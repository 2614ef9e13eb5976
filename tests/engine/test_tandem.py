"""Tandem rollouts in the engine against a naive loop in which both models step once per token: the same tokens,
the same writers, the hot model's log-prob of every kept token."""

from __future__ import annotations

import random

import pytest
import torch

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.tandem.config import TandemConfig, owner_stream
from tandemrl.types import Request, Rollout, SamplingParams
from tandemrl.engine.model.cuda_graphs import DecodeGraphs
from tests.engine.test_model_runner import _EagerGraph, build

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def engine_config(**overrides) -> EngineConfig:
    return EngineConfig(**{"block_size": 4, "num_blocks": 256, "cuda_graphs": DEVICE == "cuda", **overrides})


def requests(count: int = 5, max_tokens: int = 12, temperature: float = 0.0) -> list[Request]:
    rng = random.Random(0)
    return [Request(f"t{i}", [rng.randrange(3, 128) for _ in range(3 + 3 * i)],
                    SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True, seed=i))
            for i in range(count)]


def tandem_generate(hot, frozen, tandem: TandemConfig, reqs: list[Request], staged: bool = False,
                    **cfg) -> list[Rollout]:
    """``staged``: the forwards go through the CUDA-graph staging (on the CPU: eager stand-ins for the graphs)."""
    backend = EngineBackend(hot, None, engine_config(**cfg), tandem=tandem, frozen_model=frozen)
    slots = list(backend.runner.slots.values())
    if staged:
        for slot in slots:
            slot.enforce_eager = False
    out = backend.generate(reqs)
    assert not staged or all(slot.graphs is not None and slot.graphs.graphs for slot in slots)
    backend.close()
    return out


def naive(hot, frozen, tandem: TandemConfig, req: Request) -> tuple[list[int], list[bool], list[float]]:
    """Both models read the whole sequence at every position; the owner stream says whose argmax is kept."""
    return naive_with(owner_stream(tandem, req.request_id, req.params.seed), hot, frozen, req)


@pytest.mark.parametrize("selector, p, staged", [("bernoulli", 0.5, False), ("chunk", 0.5, False),
                                                 ("alternating", 0.5, False), ("bernoulli", 0.3, True)])
def test_greedy_tandem_equals_the_naive_loop(selector, p, staged, monkeypatch):
    if staged and DEVICE == "cpu":  # a burst's forwards staged at once, each replayed by its (eager) graph
        monkeypatch.setattr(DecodeGraphs, "_capture", lambda self, *key: ((g := _EagerGraph(self, *key)), g.out))
    hot, frozen = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    tandem = TandemConfig(enabled=True, selector=selector, p=p, chunk_tokens=3, max_run_tokens=3)
    reqs = requests()
    out = tandem_generate(hot, frozen, tandem, reqs, staged=staged)
    for req, r in zip(reqs, out):
        ids, writers, logprobs = naive(hot, frozen, tandem, req)
        assert r.completion_ids == ids, req.request_id
        assert r.token_sources == writers, req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
    assert any(not w for r in out for w in r.token_sources) and any(w for r in out for w in r.token_sources)


def test_p_one_is_the_vanilla_rollout_and_p_zero_the_frozen_one():
    hot, frozen = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    reqs = requests()

    def vanilla(model) -> list[list[int]]:
        backend = EngineBackend(model, None, engine_config())
        out = [r.completion_ids for r in backend.generate(reqs)]
        backend.close()
        return out

    all_hot = tandem_generate(hot, frozen, TandemConfig(enabled=True, p=1.0), reqs)
    assert [r.completion_ids for r in all_hot] == vanilla(hot)
    assert all(all(r.token_sources) for r in all_hot)
    all_frozen = tandem_generate(hot, frozen, TandemConfig(enabled=True, p=0.0), reqs)
    assert [r.completion_ids for r in all_frozen] == vanilla(frozen)
    assert not any(w for r in all_frozen for w in r.token_sources)


def test_sampled_frozen_fraction_follows_p_and_survives_preemption():
    hot, frozen = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    tandem = TandemConfig(enabled=True, p=0.7, max_run_tokens=4)
    reqs = requests(count=8, max_tokens=40, temperature=1.0)
    out = tandem_generate(hot, frozen, tandem, reqs, num_blocks=40)
    writers = [w for r in out for w in r.token_sources]
    assert all(len(r.token_sources) == len(r.completion_ids) == 40 for r in out)
    n = len(writers)
    frozen_fraction = writers.count(False) / n
    assert abs(frozen_fraction - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    assert sum(r.stats.preemptions for r in out) > 0
    assert all(lp <= 0 for r in out for lp in r.logprobs)


def test_tandem_configuration_errors_are_clear():
    hot = build("qwen2", device=DEVICE)
    with pytest.raises(ValueError, match="need a frozen model"):
        EngineBackend(hot, None, engine_config(), tandem=TandemConfig(enabled=True))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        EngineBackend(hot, None, engine_config(), tandem=TandemConfig(enabled=True, selector="word"),
                      frozen_model=build("qwen2", seed=1, device=DEVICE))


class WordTokenizer:
    """128 ids; every fifth one decodes to a word start (" w"), the others to "a": word boundaries."""

    all_special_ids: list[int] = []
    eos_token_id = None
    pad_token_id = 0

    def __len__(self) -> int:
        return 128

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(" w" if i % 5 == 0 else "a" for i in ids)

    def convert_ids_to_tokens(self, i: int) -> str:
        return "w" if i % 5 == 0 else "a"


@pytest.mark.parametrize("selector", ["word", "sentence"])
def test_boundary_selectors_cut_frozen_runs_like_the_naive_loop(selector):
    """The frozen model's run ends at the first boundary it writes when the next segment is the hot model's; the
    engine cuts it on the host and continues with the hot model's token there."""
    from tandemrl.tandem.boundaries import boundary_ids

    hot, frozen = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    tokenizer = WordTokenizer()
    if selector == "sentence":  # sentence boundaries: ids whose text ends with "." (every seventh here)
        tokenizer.decode = lambda ids, skip_special_tokens=False: "".join("." if i % 7 == 0 else "a" for i in ids)
    tandem = TandemConfig(enabled=True, selector=selector, p=0.5, max_gap_tokens=6, max_run_tokens=4)
    reqs = requests(max_tokens=16)
    backend = EngineBackend(hot, tokenizer, engine_config(), tandem=tandem, frozen_model=frozen)
    out = backend.generate(reqs)
    boundaries = boundary_ids(tokenizer, selector)
    cuts = 0
    for req, r in zip(reqs, out):
        stream = owner_stream(tandem, req.request_id, req.params.seed, boundaries)
        ids, writers, logprobs = naive_with(stream, hot, frozen, req)
        assert r.completion_ids == ids and r.token_sources == writers, req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
        cuts += sum(1 for a, b, t in zip(writers, writers[1:], ids) if not a and b and t in boundaries)
    assert cuts > 0  # some frozen runs did end at a boundary


@torch.no_grad()
def naive_with(stream, hot, frozen, req: Request) -> tuple[list[int], list[bool], list[float]]:
    """Both models read the whole sequence, each on its own device, at every position; the owner stream says whose
    argmax is kept; the log-prob is the hot model's."""
    ids, writers, logprobs = list(req.prompt_ids), [], []
    for _ in range(req.params.max_tokens):
        hot_writes = stream.next_segment(1)[0] == 0
        hot_logits = hot(torch.tensor([ids], device=hot.device)).logits[0, -1].float().cpu()
        logits = hot_logits
        if not hot_writes:
            logits = frozen(torch.tensor([ids], device=frozen.device)).logits[0, -1].float().cpu()
        token = int(logits.argmax())
        ids.append(token)
        writers.append(hot_writes)
        logprobs.append(float(torch.log_softmax(hot_logits, -1)[token]))
        stream.advance([token], [hot_writes])
    return ids[len(req.prompt_ids):], writers, logprobs


def test_requests_outside_tandem_are_the_hot_models_alone():
    """Evaluation's requests (tandem=False) share a tandem engine's batch with tandem ones."""
    hot, frozen = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    tandem = TandemConfig(enabled=True, p=0.3)
    mixed = requests()
    for req in mixed[::2]:
        req.tandem = False
    out = tandem_generate(hot, frozen, tandem, mixed)
    backend = EngineBackend(hot, None, engine_config())
    vanilla = backend.generate(requests())
    for req, r, v in zip(mixed, out, vanilla):
        if not req.tandem:
            assert r.completion_ids == v.completion_ids and r.token_sources == [True] * len(v.completion_ids)
    assert any(not w for req, r in zip(mixed, out) if req.tandem for w in r.token_sources)


def test_blocks_decoded_by_the_hot_model_alone_never_serve_a_tandem_prompt():
    """A batch of requests outside tandem decodes with the hot model alone, so the frozen model's cache misses those
    positions: a later tandem prompt that continues such a completion must not reuse its blocks (prefix cache)."""
    hot, frozen = build("qwen2", device=DEVICE), build("qwen2", seed=1, device=DEVICE)
    tandem = TandemConfig(enabled=True, p=0.3)
    first = requests(count=1, max_tokens=24)[0]
    first.tandem = False
    backend = EngineBackend(hot, None, engine_config(), tandem=tandem, frozen_model=frozen)
    completion = backend.generate([first])[0].completion_ids
    follow = Request("t-next", first.prompt_ids + completion,
                     SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, seed=3))
    reused = backend.generate([follow])[0]
    backend.close()
    fresh = tandem_generate(hot, frozen, tandem, [follow])[0]
    assert reused.completion_ids == fresh.completion_ids
    assert reused.token_sources == fresh.token_sources
