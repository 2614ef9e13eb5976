"""tandem.frozen_device: the frozen model on another device than the hot one (the CPU, or a second GPU) writes the
same tokens as beside it, and as the naive loop in which both models step once per token (greedy).

The GPU tests run where CUDA is. On the CPU, "cpu:0" stands in for another device (torch.device compares the index,
while the tensors stay on the CPU): the frozen slot then takes every cross-device branch of the runner. The wiring
of tandem.frozen_device is covered by tests/train/test_loop.py and tests/config/test_config.py.
"""

from __future__ import annotations

import pytest
import torch

import tandemrl.engine.model.prefill as prefill_module
import tandemrl.engine.model.proposers as proposers_module
import tandemrl.engine.model.tandem_runner as tandem_runner_module
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.model.placement import CPU_KV_BUDGET_BYTES, canonical, move, on_device
from tandemrl.engine.model.slot import ModelSlot
from tandemrl.tandem.config import TandemConfig, owner_stream
from tandemrl.types import Request, Rollout
from tests.engine.test_model_runner import build
from tests.engine.test_tandem import WordTokenizer, engine_config, naive_with, requests

CUDA = torch.cuda.is_available()
ELSEWHERE = ["cpu"] + (["cuda:1"] if CUDA and torch.cuda.device_count() > 1 else [])
needs_cuda = pytest.mark.skipif(not CUDA, reason="the hot model on a GPU, the frozen one elsewhere")


def generate(hot, frozen, tandem: TandemConfig, reqs: list[Request], tokenizer=None) -> list[Rollout]:
    backend = EngineBackend(hot, tokenizer, engine_config(cuda_graphs=True), tandem=tandem, frozen_model=frozen)
    frozen_device = backend.runner.slots["frozen"].device
    assert frozen_device == canonical(next(frozen.parameters()).device)
    assert backend.engine.scheduler.paired_tandem == (frozen_device.type == "cuda")  # another GPU too; not the CPU
    out = backend.generate(reqs)
    backend.close()
    return out


def naive(hot, frozen, stream, req: Request) -> tuple[list[int], list[bool], list[float]]:
    return naive_with(stream, hot, frozen, req)  # each model on its own device


SELECTORS = [("bernoulli", 0.5), ("alternating", 0.5), ("word", 0.5), ("bernoulli", 0.0)]


@pytest.mark.parametrize("selector, p", SELECTORS)
def test_the_frozen_slot_takes_the_cross_device_branches_on_the_cpu(selector, p, monkeypatch):
    """The frozen slot on "cpu:0": its own sampler, indices and prefill inputs, token ids moved to it and back; the
    greedy rollout equals the naive loop's (and so the single-device one's, tests/engine/test_tandem.py)."""
    elsewhere = _frozen_slot_on_cpu0(monkeypatch)
    moved, burst_moved = [], []

    def counted(into):
        def counted_move(tensor, device):
            into.append(device)
            return move(tensor, device)
        return counted_move

    for module in (prefill_module, proposers_module):
        monkeypatch.setattr(module, "move", counted(moved))
    monkeypatch.setattr(tandem_runner_module, "move", counted(burst_moved))
    hot, frozen = build("qwen2"), build("qwen2", seed=1)
    tokenizer = WordTokenizer() if selector == "word" else None
    tandem = TandemConfig(enabled=True, selector=selector, p=p, max_gap_tokens=6, max_run_tokens=3)
    reqs = requests(count=3, max_tokens=10)
    backend = EngineBackend(hot, tokenizer, engine_config(), tandem=tandem, frozen_model=frozen)
    runner = backend.runner
    assert runner.slots["frozen"].device == elsewhere
    assert runner.context.sampler_for(runner.slots["frozen"]) is not runner.sampler  # its rows sample on its device
    out = backend.generate(reqs)
    backend.close()
    assert torch.device("cpu") in moved + burst_moved  # the frozen slot's tokens came back
    assert (elsewhere in burst_moved) == (selector != "word")  # a burst's frozen forwards read the buffer on the hot side
    if selector == "word":  # a segment's frozen proposer reads its rows' columns on its own device
        assert elsewhere in moved
    boundaries = _boundaries(tokenizer, selector)
    for req, r in zip(reqs, out):
        ids, writers, logprobs = naive(hot, frozen, owner_stream(tandem, req.request_id, req.params.seed, boundaries),
                                       req)
        assert r.completion_ids == ids and r.token_sources == writers, req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_paired_ticks_across_devices_send_the_frozen_reads_before_the_hot_forward(p, monkeypatch):
    """Paired ticks with the frozen slot on another device (as with "cuda:1"; forced here on the "cpu:0" stand-in):
    the greedy rollout equals the naive loop's, and the tokens a frozen forward reads are sent to its device before
    the hot forward it runs beside is launched (after it, on the hot GPU's stream, they would wait for it)."""
    elsewhere = _frozen_slot_on_cpu0(monkeypatch)
    events: list[str] = []
    forwards = ModelSlot.decode_forwards

    def logged_forwards(slot, plans):
        run = forwards(slot, plans)
        return lambda f, ids: (events.append(slot.name), run(f, ids))[1]

    def logged_move(tensor, device):
        events.append("send" if device == elsewhere else "back")
        return move(tensor, device)

    monkeypatch.setattr(ModelSlot, "decode_forwards", logged_forwards)
    monkeypatch.setattr(tandem_runner_module, "move", logged_move)
    hot, frozen = build("qwen2"), build("qwen2", seed=1)
    tandem = TandemConfig(enabled=True, p=p)
    reqs = requests(count=4, max_tokens=12)
    backend = EngineBackend(hot, None, engine_config(decode_steps=4), tandem=tandem, frozen_model=frozen)
    backend.engine.scheduler.paired_tandem = True  # the schedule of two GPUs (off a GPU: turns)
    out = backend.generate(reqs)
    backend.close()
    for req, r in zip(reqs, out):
        ids, writers, logprobs = naive(hot, frozen, owner_stream(tandem, req.request_id, req.params.seed, None), req)
        assert r.completion_ids == ids and r.token_sources == writers, req.request_id
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
    trace = " ".join(events)
    assert "send target frozen" in trace  # a tick: the frozen reads sent, then both forwards
    assert "target send frozen" not in trace  # never behind the hot forward before it


def _frozen_slot_on_cpu0(monkeypatch) -> torch.device:
    """Runners made from now on place their frozen slot on "cpu:0" (another device, in name only)."""
    elsewhere = torch.device("cpu", 0)
    place = ModelRunner._slot

    def placed(self, name, model, config, attention_backend):
        slot = place(self, name, model, config, attention_backend)
        slot.device = elsewhere if name == "frozen" else slot.device
        return slot

    monkeypatch.setattr(ModelRunner, "_slot", placed)
    return elsewhere


def _boundaries(tokenizer, selector: str):
    if tokenizer is None:
        return None
    from tandemrl.tandem.boundaries import boundary_ids

    return boundary_ids(tokenizer, selector)


@needs_cuda
@pytest.mark.parametrize("frozen_device", ELSEWHERE)
@pytest.mark.parametrize("selector, p", [("bernoulli", 0.5), ("alternating", 0.5), ("word", 0.5), ("bernoulli", 0.0)])
def test_a_frozen_model_elsewhere_writes_what_it_writes_beside_the_hot_one(frozen_device, selector, p):
    """Greedy: the same tokens, writers and (within float tolerance) log-probs as the single-device tandem rollout and
    the naive loop; bernoulli/alternating run the tandem burst, word the segment path, p = 0 the prefill's first
    tokens from the frozen model."""
    hot = build("qwen2", device="cuda")
    beside, elsewhere = build("qwen2", seed=1, device="cuda"), build("qwen2", seed=1, device=frozen_device)
    tokenizer = WordTokenizer() if selector == "word" else None
    tandem = TandemConfig(enabled=True, selector=selector, p=p, max_gap_tokens=6, max_run_tokens=3)
    reqs = requests(max_tokens=16)
    together = generate(hot, beside, tandem, reqs, tokenizer)
    apart = generate(hot, elsewhere, tandem, reqs, tokenizer)
    boundaries = _boundaries(tokenizer, selector)
    for req, a, b in zip(reqs, apart, together):
        assert a.completion_ids == b.completion_ids and a.token_sources == b.token_sources, req.request_id
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4), req.request_id
        stream = owner_stream(tandem, req.request_id, req.params.seed, boundaries)
        ids, writers, logprobs = naive(hot, elsewhere, stream, req)
        assert a.completion_ids == ids and a.token_sources == writers, req.request_id
        assert a.logprobs == pytest.approx(logprobs, abs=1e-4), req.request_id
    assert any(not w for r in apart for w in r.token_sources)


@needs_cuda
@pytest.mark.parametrize("frozen_device", ELSEWHERE)
def test_sampled_rollouts_with_the_frozen_model_elsewhere_repeat_and_follow_p(frozen_device):
    """The frozen rows sample on the frozen model's device (its own seeded stream): a seeded run repeats, and the
    frozen fraction follows 1 - p."""
    hot, frozen = build("qwen2", device="cuda"), build("qwen2", seed=1, device=frozen_device)
    tandem = TandemConfig(enabled=True, p=0.7)
    reqs = requests(count=8, max_tokens=40, temperature=1.0)
    first, again = generate(hot, frozen, tandem, reqs), generate(hot, frozen, tandem, reqs)
    assert [r.completion_ids for r in first] == [r.completion_ids for r in again]
    writers = [w for r in first for w in r.token_sources]
    n = len(writers)
    assert abs(writers.count(False) / n - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    assert all(lp <= 0 for r in first for lp in r.logprobs)


@needs_cuda
def test_a_frozen_model_on_the_cpu_bounds_the_blocks_by_the_cpu_budget():
    """Every slot holds the same block ids: the device with the least room for its pools sets the count."""
    hot, frozen = build("qwen2", device="cuda"), build("qwen2", seed=1, device="cpu")
    backend = EngineBackend(hot, None, engine_config(), tandem=TandemConfig(enabled=True), frozen_model=frozen)
    runner = backend.runner
    per_block = runner.slots["frozen"].bytes_per_block(16)
    assert runner.num_blocks_that_fit(16, 0.5) == CPU_KV_BUDGET_BYTES // per_block - 1
    backend.close()


def test_moves_stay_put_on_the_same_device_and_guard_nothing_off_the_gpu():
    ids = torch.arange(4)
    assert move(ids, torch.device("cpu")) is ids
    with on_device(torch.device("cpu"), torch.device("cpu")):
        assert move(ids * 2, canonical("cpu")).tolist() == [0, 2, 4, 6]
    if CUDA:
        there = move(ids, canonical("cuda"))
        assert there.device == canonical("cuda") and move(there, torch.device("cpu")).tolist() == [0, 1, 2, 3]
