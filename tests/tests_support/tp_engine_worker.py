"""One rank of the 2-process tensor-parallel engine test (tests/engine/test_tensor_parallel.py), run by
torch.multiprocessing over gloo. Both ranks build the same random model from one seed; rank 0 also decodes with the
whole model (N = 1) and writes both outputs for the test to compare."""

from __future__ import annotations

import json
import random

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.models.tensor_parallel import TensorParallelGroup
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.tandem.config import TandemConfig
from tandemrl.types import Request, SamplingParams

# Qwen2.5-0.5B's shapes (14 heads, 2 KV heads, head size 64, MLP 4864, biased q/k/v, tied embeddings), 2 layers;
# an odd vocabulary so the last rank's vocabulary shard has a padding row.
QWEN25_05B = dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                  num_hidden_layers=2, vocab_size=1001, tie_word_embeddings=True, max_position_embeddings=512,
                  rope_theta=1000000.0, rms_norm_eps=1e-6)


def build_model(name: str, tiny_dir: str, seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    if name == "tiny":
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**{**QWEN25_05B, **overrides})).float()
    model.generation_config.eos_token_id = None
    return model.eval()


def requests(vocab: int, temperature: float = 0.0) -> list[Request]:
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (1, 5, 9, 17)]
    prompts.append(prompts[2])  # a shared prompt: the prefix cache serves it
    return [Request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=temperature, ignore_eos=True, seed=i))
            for i, p in enumerate(prompts)]


def partner_runs(rank: int, world: int, tiny_dir: str, tp: TensorParallelGroup) -> dict:
    """Tandem (the frozen model split too), speculative decoding (the draft whole on each rank) and seeded sampling,
    with 2 ranks and with 1: tokens (and tandem's writers)."""
    model = build_model("qwen2.5-0.5b", tiny_dir)
    frozen = build_model("qwen2.5-0.5b", tiny_dir, seed=1)
    draft = build_model("qwen2.5-0.5b", tiny_dir, seed=2, num_hidden_layers=1)
    cases = {
        "tandem": (requests(model.config.vocab_size), dict(
            tandem=TandemConfig(enabled=True, selector="bernoulli", p=0.5), frozen_model=frozen)),
        "draft": (requests(model.config.vocab_size), dict(
            speculative=SpeculativeConfig(method="draft", num_tokens=3), draft_model=draft)),
        "sampled": (requests(model.config.vocab_size, temperature=1.0), {}),
    }
    out = {}
    for case, (reqs, kwargs) in cases.items():
        both = {}
        for label, size in (("tp", world), ("reference", 1)):
            if label == "reference" and rank != 0:
                continue
            config = EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False, tensor_parallel_size=size)
            backend = EngineBackend(model, None, config, device="cpu", tensor_parallel=tp if size > 1 else None,
                                    **kwargs)
            rollouts = backend.generate(reqs)
            assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
            both[label] = [[r.completion_ids, r.token_sources] for r in rollouts]
            backend.close()
        gathered = [None] * world
        dist.all_gather_object(gathered, both["tp"])
        out[case] = {**both, "ranks_agree": all(g == gathered[0] for g in gathered)}
    return out


def decode(backend: EngineBackend, reqs: list[Request]) -> list[list[int]]:
    out = backend.generate(reqs)
    assert all(r.error is None for r in out), [r.error for r in out]
    return [r.completion_ids for r in out]


def run_rank(rank: int, world: int, store_file: str, tiny_dir: str, result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    try:
        tp = TensorParallelGroup(rank=rank, size=world)
        config = EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False, tensor_parallel_size=world)
        whole = EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False)
        results = {}
        for name in ("tiny", "qwen2.5-0.5b"):
            model = build_model(name, tiny_dir)
            reqs = requests(model.config.vocab_size)
            sharded = EngineBackend(model, None, config, device="cpu", tensor_parallel=tp)
            shard = sharded.engine_model
            tp_tokens = decode(sharded, reqs)
            sharded.sleep()
            freed = sharded.runner.target.k_caches == []
            sharded.wake()
            again = decode(sharded, reqs[:2])
            sharded.close()
            result = {"tp": tp_tokens, "after_wake": again, "sleep_freed": freed,
                      "shard_params": sum(p.numel() for p in shard.parameters()),
                      "full_params": sum(p.numel() for p in model.parameters()),
                      "local_kv_heads": shard.config.num_key_value_heads}
            if rank == 0:
                result["reference"] = decode(EngineBackend(model, None, whole, device="cpu"), reqs)
            results[name] = result
        results["partners"] = partner_runs(rank, world, tiny_dir, tp)
        if rank == 0:
            with open(result_file, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()
