"""The server's start-up warm-up (tandemrl/serve/warmup.py) runs one decode batch per CUDA graph bucket, each a whole
burst, and leaves the engine idle with no prefix-cache block of its dummy prompts to reuse."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.serve.warmup import PROMPT_TOKENS, warm_up
from tandemrl.types import Request, SamplingParams


def _backend(max_num_seqs: int, device: str = "cpu") -> EngineBackend:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg).float().eval().to(device)
    config = EngineConfig(block_size=16, num_blocks=256, max_num_seqs=max_num_seqs, decode_steps=4,
                          cuda_graphs=device == "cuda")
    return EngineBackend(model, None, config, device=torch.device(device))


def test_one_whole_burst_per_bucket_then_an_idle_engine_with_a_cold_prefix_cache():
    backend = _backend(max_num_seqs=20)
    engine = backend.engine
    plans = []
    launch = engine.runner.launch
    engine.runner.launch = lambda plan: (plans.append(plan), launch(plan))[1]
    try:
        done = warm_up(engine, vocab_size=128)
        assert done.batches == [1, 2, 4, 8, 16, 20]  # the buckets below max_num_seqs, then max_num_seqs itself
        decodes = [p for p in plans if not p.is_prefill]
        assert [len(p.seqs) for p in decodes] == done.batches  # each batch decoded together, in one burst...
        assert all(p.num_tokens == [4] * len(p.seqs) for p in decodes)  # ...of decode_steps steps
        prompts = [s.token_ids[:PROMPT_TOKENS] for p in plans if p.is_prefill for s in p.seqs]
        assert len(prompts) == sum(done.batches) and len({tuple(p) for p in prompts}) == len(prompts)
        assert not engine.has_unfinished()

        computed = engine.stats()["prefill_tokens_computed"]
        params = SamplingParams(max_tokens=1, temperature=0.0)
        engine.generate([Request("after", prompts[-1], params)])
        assert engine.stats()["prefill_tokens_computed"] - computed == PROMPT_TOKENS  # nothing reused
    finally:
        backend.close()


def test_max_num_seqs_past_the_largest_bucket_warms_up_to_that_bucket():
    backend = _backend(max_num_seqs=300)
    sizes = []
    backend.engine.generate = lambda requests: sizes.append(len(requests))  # the batch sizes only, not 256 runs
    try:
        assert warm_up(backend.engine, vocab_size=128).batches == [1, 2, 4, 8, 16, 32, 64, 128, 256]
        assert sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    finally:
        backend.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs: a GPU test")
def test_on_cuda_batches_of_any_size_afterwards_capture_no_new_graph():
    backend = _backend(max_num_seqs=64, device="cuda")
    try:
        warm_up(backend.engine, vocab_size=128)
        graphs = backend.runner.target.graphs
        captured = set(graphs.graphs)
        assert {bucket for bucket, _, _ in captured} == {1, 2, 4, 8, 16, 32, 64}
        # 37 sequences finishing one by one: their batch shrinks through every bucket from 64 down to 1
        prompts = torch.randint(0, 128, (37, 40), generator=torch.Generator().manual_seed(1)).tolist()
        rollouts = backend.engine.generate([Request(f"r{i}", p, SamplingParams(max_tokens=5 + i, ignore_eos=True))
                                            for i, p in enumerate(prompts)])
        assert [len(r.completion_ids) for r in rollouts] == [5 + i for i in range(37)]
        assert {bucket for bucket, _, _ in graphs.graphs} == {bucket for bucket, _, _ in captured}
        if graphs.fixed_width:  # the Triton kernel: one table width for every context length
            assert set(graphs.graphs) == captured
    finally:
        backend.close()
