"""EngineBackend with the real model runner on a tiny random Qwen2 (float32): greedy tokens equal Hugging Face
generate's, also when the prefix cache shares a prompt and when a tiny pool forces preemption."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("tandemrl.engine.model_runner")
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from tandemrl.backends.engine_backend import EngineBackend  # noqa: E402
from tandemrl.engine.config import EngineConfig  # noqa: E402
from tandemrl.types import Request, SamplingParams  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg).float().eval().to(DEVICE)
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt], device=DEVICE)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def greedy(rid: str, prompt: list[int], max_tokens: int) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


def check(model, requests, rollouts) -> None:
    for q, r in zip(requests, rollouts):
        assert r.error is None, r.error
        assert r.completion_ids == hf_greedy(model, q.prompt_ids, q.params.max_tokens), q.request_id


def test_mixed_lengths_and_a_shared_prompt_match_hf(model):
    rng = random.Random(0)
    backend = EngineBackend(model, None, EngineConfig(block_size=4, num_blocks=128, cuda_graphs=False))
    shared = [rng.randrange(3, 128) for _ in range(18)]
    requests = [greedy(f"m{n}", [rng.randrange(3, 128) for _ in range(n)], 6 + n % 5) for n in (1, 5, 8, 13)]
    requests += [greedy(f"g{j}", shared, 8) for j in range(4)]
    out = backend.generate(requests)
    check(model, requests, out)
    stats = backend.stats()
    assert stats["prefill_tokens_computed"] == stats["prefill_tokens_requested"] - 3 * 16
    backend.sleep()
    backend.wake()
    check(model, requests[:2], backend.generate(requests[:2]))
    backend.close()


def test_preemption_matches_hf(model):
    rng = random.Random(1)
    backend = EngineBackend(model, None, EngineConfig(block_size=4, num_blocks=12, cuda_graphs=False))
    requests = [greedy(f"p{i}", [rng.randrange(3, 128) for _ in range(5 + i)], 20) for i in range(5)]
    out = backend.generate(requests)
    assert backend.stats()["preemptions"] > 0
    check(model, requests, out)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_bursts_and_joining_requests_match_hf_with_or_without_async_scheduling(model, async_scheduling):
    """Default engine (CUDA graphs on a GPU): at most 3 sequences at once, so requests join while a burst of the
    others is in flight, and bursts start from tokens still pending on the device."""
    rng = random.Random(2)
    config = EngineConfig(block_size=4, num_blocks=128, decode_steps=4, max_num_seqs=3,
                          async_scheduling=async_scheduling)
    backend = EngineBackend(model, None, config)
    requests = [greedy(f"b{i}", [rng.randrange(3, 128) for _ in range(3 + 2 * i)], 5 + 3 * i) for i in range(6)]
    check(model, requests, backend.generate(requests))
    backend.close()
