"""Cached K/V belongs to the weights that computed it: after an in-place weight change (optimizer step, loaded state
dict, LoRA adapter switched) the same engine, with no sleep()/wake() in between, must produce what a fresh engine on
the changed model produces, token for token."""

from __future__ import annotations

import random

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.types import Request, Rollout, SamplingParams
from tests.engine.test_model_runner import build

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIG = EngineConfig(block_size=4, num_blocks=128, cuda_graphs=DEVICE == "cuda")


def requests() -> list[Request]:
    """Samples of one long prompt (its blocks are cached and shared) and a prompt that extends it."""
    rng = random.Random(0)
    shared = [rng.randrange(3, 128) for _ in range(21)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return [Request(f"r{i}", shared, params) for i in range(3)] + [Request("x", shared + [7, 9], params)]


def assert_same(out: list[Rollout], ref: list[Rollout]) -> None:
    for mine, theirs in zip(out, ref):
        assert mine.completion_ids == theirs.completion_ids, mine.request_id
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4), mine.request_id


def fresh(model) -> list[Rollout]:
    backend = EngineBackend(model, None, CONFIG)
    out = backend.generate(requests())
    backend.close()
    return out


def optimizer_step(model, fused: bool) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=fused, foreach=None if fused else True)
    model.train()
    model(torch.tensor([[1, 2, 3, 4]], device=DEVICE), labels=torch.tensor([[1, 2, 3, 4]], device=DEVICE)).loss.backward()
    optimizer.step()
    model.eval()


def load_other_weights(model) -> None:
    model.load_state_dict(build("qwen2", seed=1, device=DEVICE).state_dict())


@pytest.mark.parametrize("change, policy_version", [
    (lambda m: optimizer_step(m, fused=False), 0),  # seen through the parameters' version counters
    (lambda m: optimizer_step(m, fused=True), 1),  # fused AdamW bumps no counter: the trainer's policy version does
    (load_other_weights, 0),
], ids=["adamw-foreach", "adamw-fused", "load-state-dict"])
def test_weight_change_in_place_invalidates_cached_blocks(change, policy_version):
    model = build("qwen2", device=DEVICE)
    backend = EngineBackend(model, None, CONFIG)
    before = backend.generate(requests())
    hits = backend.stats()["prefix_cache_hit_blocks"]
    assert hits > 0  # the samples shared the prompt's blocks
    change(model)
    after = backend.generate(requests(), policy_version=policy_version)
    assert [r.completion_ids for r in after] != [r.completion_ids for r in before]  # the change matters
    assert_same(after, fresh(model))
    assert backend.stats()["prefix_cache_hit_blocks"] == 2 * hits  # shared again, within the new weights only


def test_lora_adapter_switched_off_invalidates_cached_blocks():
    model = get_peft_model(build("qwen2", device=DEVICE), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                                     init_lora_weights=False))
    backend = EngineBackend(model, None, CONFIG)
    with_adapter = backend.generate(requests())
    with model.disable_adapter():
        without = backend.generate(requests())
        assert [r.completion_ids for r in without] != [r.completion_ids for r in with_adapter]
        assert_same(without, fresh(model))
    assert_same(backend.generate(requests()), with_adapter)


def test_invalidate_prefix_cache_covers_writes_through_data():
    """``param.data`` bypasses the version counter: the engine offers an explicit call for that."""
    model = build("qwen2", device=DEVICE)
    backend = EngineBackend(model, None, CONFIG)
    backend.generate(requests())
    for p in model.parameters():
        p.data.mul_(1.5)
    backend.engine.invalidate_prefix_cache()
    assert_same(backend.generate(requests()), fresh(model))
