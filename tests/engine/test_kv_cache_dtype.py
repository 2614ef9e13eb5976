"""engine.kv_cache_dtype: an fp8 (e4m3) KV cache holds half the bytes, and the runner's log-probs stay close to
those of the model-dtype cache (the SDPA path on the CPU; the Triton kernels' fp8 loads and stores are tested in
test_paged_attention.py and test_fused_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from tandemrl.engine.config import EngineConfig
from tests.engine.test_model_runner import BLOCK, Blocks, build, generate, make_seq, prompts_of, runner_for


def test_kv_cache_dtype_is_validated_by_name():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8").validate()
    EngineConfig(kv_cache_dtype="fp8_e4m3").validate()


def _rollout(model, kv_cache_dtype: str):
    runner = runner_for(model, kv_cache_dtype=kv_cache_dtype)
    blocks = Blocks(64)
    seqs = [make_seq(i, p, blocks.take(3)) for i, p in enumerate(prompts_of([5, 17, 30]))]
    generate(runner, seqs, 8)
    return runner, seqs


def test_fp8_cache_halves_the_pool_and_keeps_log_probs_close():
    model = build("qwen2", dtype=torch.bfloat16)
    auto_runner, auto = _rollout(model, "auto")
    fp8_runner, fp8 = _rollout(model, "fp8_e4m3")
    slot = fp8_runner.slots[next(iter(fp8_runner.slots))]
    assert slot.k_caches[0].dtype == torch.float8_e4m3fn and slot.k_caches[0].abs().float().sum() > 0
    assert 2 * fp8_runner.bytes_per_block(BLOCK) == auto_runner.bytes_per_block(BLOCK)
    diffs = [abs(a - b) for sa, sb in zip(auto, fp8) for a, b in zip(sa.logprobs, sb.logprobs)]
    first = [abs(sa.logprobs[0] - sb.logprobs[0]) for sa, sb in zip(auto, fp8)]
    assert max(first) < 0.1 and 0 < max(diffs)  # the same tokens first; the cache's rounding shows
