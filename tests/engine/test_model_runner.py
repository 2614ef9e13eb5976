"""The model runner against Hugging Face: greedy generate token for token, prefix sharing, recompute, sampled
log-probs, zero copy, peft LoRA. Tiny random models in float32 on the CPU; GPU checks skipped without CUDA."""

from __future__ import annotations

import gc
import random

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from tandemrl.engine.model.cuda_graphs import DecodeGraphs
from tandemrl.engine.model.sampler import sample_tokens
from tandemrl.engine.model.runner import CPU_KV_BUDGET_BYTES, ModelRunner
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.sequence import Sequence
from tandemrl.types import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
              intermediate_size=128, max_position_embeddings=256)
ARCHS = {
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=32)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**{**COMMON, "num_attention_heads": 4, "num_key_value_heads": 2})),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**COMMON, sliding_window=12)),  # windows within the run
}


def build(arch: str = "qwen2", seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    torch.manual_seed(seed)
    model = ARCHS[arch]().to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class Blocks:
    """Hands out block ids from a shuffled pool, so tables are never contiguous by accident."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        ids, self.free = self.free[:n], self.free[n:]
        return ids


def make_seq(seq_id: int, prompt: list[int], blocks: list[int], params: SamplingParams = GREEDY) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(prompt), len(prompt), params, block_table=list(blocks))


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=g).tolist() for n in lengths]


def step(runner: ModelRunner, seqs: list[Sequence], is_prefill: bool) -> None:
    tokens, logprobs = runner.run(seqs, is_prefill)
    for seq, tok, lp in zip(seqs, tokens, logprobs):
        seq.token_ids.append(tok)
        seq.logprobs.append(lp)


def generate(runner: ModelRunner, seqs: list[Sequence], new_tokens: int) -> None:
    step(runner, seqs, True)
    for _ in range(new_tokens - 1):
        step(runner, seqs, False)


def runner_for(model, num_blocks: int = 64, **kwargs) -> ModelRunner:
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK, **kwargs), "cpu")
    runner.allocate_kv_cache(num_blocks)
    return runner


def hf_greedy(model, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt):].tolist()
    lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(out.logits, ids)]
    return ids, lps


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0].float()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_matches_hf_generate(arch):
    model = build(arch)
    runner = runner_for(model)
    blocks = Blocks(64)
    new = 10
    seqs = [make_seq(i, p, blocks.take(-(-(len(p) + new) // BLOCK))) for i, p in enumerate(prompts_of([5, 17, 33, 1]))]
    generate(runner, seqs, new)
    for seq in seqs:
        ids, lps = hf_greedy(model, seq.token_ids[:seq.num_prompt_tokens], new)
        assert seq.completion_ids == ids
        assert seq.logprobs == pytest.approx(lps, abs=1e-4)


def test_prefix_cache_hits_in_the_same_batch():
    """The second sequence reads the first's two prompt blocks, written by the same prefill forward."""
    model = build("qwen2")
    shared = prompts_of([32])[0]
    new = 6

    def run(share: bool) -> list[Sequence]:
        runner, blocks = runner_for(model), Blocks(64)
        a = make_seq(0, shared, blocks.take(3))
        b = make_seq(1, shared, a.block_table[:2] + blocks.take(1) if share else blocks.take(3))
        c_prompt = shared + [7, 8, 9, 10, 11]
        c = make_seq(2, c_prompt, a.block_table[:2] + blocks.take(1) if share else blocks.take(3))
        if share:
            b.num_cached_tokens, c.num_cached_tokens = 32, 32
        generate(runner, [a, b, c], new)
        return [a, b, c]

    shared_run, full_run = run(True), run(False)
    for s, f in zip(shared_run, full_run):
        assert s.completion_ids == f.completion_ids
        assert s.logprobs == pytest.approx(f.logprobs, abs=1e-5)
    assert shared_run[1].completion_ids == hf_greedy(model, shared, new)[0]
    assert shared_run[2].completion_ids == hf_greedy(model, shared + [7, 8, 9, 10, 11], new)[0]


def test_recompute_after_preemption():
    """A sequence re-prefilled with its generated tokens (into other blocks) continues as if never stopped."""
    model = build("qwen3")
    prompt = prompts_of([20])[0]
    runner, blocks = runner_for(model), Blocks(64)
    straight = make_seq(0, prompt, blocks.take(3))
    generate(runner, [straight], 12)

    first = make_seq(1, prompt, blocks.take(3))
    generate(runner, [first], 5)
    again = make_seq(1, first.token_ids, blocks.take(3))  # preempted: fresh blocks, nothing cached
    again.num_prompt_tokens, again.logprobs = len(prompt), list(first.logprobs)
    step(runner, [again], True)
    for _ in range(6):
        step(runner, [again], False)
    assert again.completion_ids == straight.completion_ids
    assert again.logprobs == pytest.approx(straight.logprobs, abs=1e-5)


def test_sampled_logprobs_match_hf_logits():
    model = build("llama")
    T = 0.7
    params = SamplingParams(temperature=T, seed=123, max_tokens=64)
    runner, blocks = runner_for(model), Blocks(64)
    seqs = [make_seq(i, p, blocks.take(3), params) for i, p in enumerate(prompts_of([9, 14], seed=4))]
    generate(runner, seqs, 8)
    for seq in seqs:
        logits = full_logits(model, seq.token_ids)
        for j, lp in enumerate(seq.logprobs):
            pos = seq.num_prompt_tokens + j
            expected = torch.log_softmax(logits[pos - 1] / T, -1)[seq.token_ids[pos]].item()
            assert lp == pytest.approx(expected, abs=1e-4)


def test_seeded_sampling_reproduces_and_filters_apply():
    model = build("qwen2")
    params = SamplingParams(temperature=1.0, top_k=5, top_p=0.9, seed=7, max_tokens=64)

    def sample() -> list[list[int]]:
        runner, blocks = runner_for(model), Blocks(64)
        seqs = [make_seq(i, p, blocks.take(2), params) for i, p in enumerate(prompts_of([6, 11]))]
        generate(runner, seqs, 10)
        for seq in seqs:  # each token is among the 5 most likely under the model
            logits = full_logits(model, seq.token_ids)
            for pos in range(seq.num_prompt_tokens, seq.num_tokens):
                assert seq.token_ids[pos] in logits[pos - 1].topk(5).indices.tolist()
        return [seq.completion_ids for seq in seqs]

    assert sample() == sample()


def test_zero_copy_and_in_place_updates_are_seen():
    model = build("qwen2")
    ptrs = {name: p.data_ptr() for name, p in model.named_parameters()}
    runner = runner_for(model)
    prompt = prompts_of([10])[0]
    before = make_seq(0, prompt, [0, 1])
    generate(runner, [before], 4)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == ptrs

    with torch.no_grad():  # an "optimizer step", in place
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    after = make_seq(1, prompt, [2, 3])
    generate(runner, [after], 4)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == ptrs
    assert after.completion_ids != before.completion_ids
    assert after.completion_ids == hf_greedy(model, prompt, 4)[0]


def test_peft_lora_model_matches_its_own_forward():
    pytest.importorskip("peft")
    from tandemrl.models.lora import LoraSettings, apply_lora

    model = apply_lora(build("qwen2"), LoraSettings(rank=4, alpha=8, dropout=0.1))
    with torch.no_grad():  # peft zero-inits lora_B: give the adapters an effect
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    model.train()  # the runner must switch dropout off for the step and restore the mode after
    runner = runner_for(model)
    prompt = prompts_of([12])[0]
    seq = make_seq(0, prompt, [0, 1])
    generate(runner, [seq], 6)
    assert all(m.training for m in model.modules())
    model.eval()
    logits = full_logits(model, seq.token_ids)
    for j, lp in enumerate(seq.logprobs):
        pos = seq.num_prompt_tokens + j
        assert seq.token_ids[pos] == int(logits[pos - 1].argmax())
        assert lp == pytest.approx(torch.log_softmax(logits[pos - 1], -1)[seq.token_ids[pos]].item(), abs=1e-4)
    with model.disable_adapter():  # the adapters matter: the base model alone computes other logits
        assert (full_logits(model, seq.token_ids) - logits).abs().max() > 1e-2


def test_unsupported_architecture_names_model_type():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(NotImplementedError, match="gpt2"):
        ModelRunner(model, EngineConfig(), "cpu")


def test_cache_sizing_and_lifecycle():
    model = build("qwen3")
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK), "cpu")
    per_block = 2 * 2 * BLOCK * 1 * 32 * 4  # K and V, layers, block, kv heads, head_dim, float32
    assert runner.bytes_per_block() == per_block
    assert runner.num_blocks_that_fit(BLOCK, 0.9) == CPU_KV_BUDGET_BYTES // per_block - 1
    seq = make_seq(0, [5, 6, 7], [0])
    with pytest.raises(RuntimeError, match="allocate_kv_cache"):
        runner.run([seq], True)
    runner.allocate_kv_cache(4)
    assert runner.run([seq], True)[0]
    with pytest.raises(ValueError, match="block ids"):
        runner.run([make_seq(1, [5, 6], [4])], True)
    with pytest.raises(ValueError, match="blocks of"):
        runner.run([make_seq(2, list(range(3, 20)), [1])], True)
    runner.free_kv_cache()
    with pytest.raises(RuntimeError, match="allocate_kv_cache"):
        runner.run([seq], False)


class _EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: replay re-runs the forward over the same static buffers."""

    def __init__(self, graphs: DecodeGraphs, bucket: int, width: int, grouped: bool) -> None:
        self.forward = graphs.forward
        self.ids, self.meta = graphs.static_inputs(bucket, width, grouped)
        self.out = self.forward(self.ids, self.meta)

    def replay(self) -> None:
        self.out.copy_(self.forward(self.ids, self.meta))


def _shrinking_decode(runner: ModelRunner, prompts: list[list[int]]) -> list[Sequence]:
    blocks = Blocks(runner.num_blocks)
    seqs = [make_seq(i, p, blocks.take(5)) for i, p in enumerate(prompts)]
    step(runner, seqs, True)
    for n in range(20):  # the batch shrinks across buckets (5 -> 3 -> 1 rows), contexts grow across widths
        step(runner, seqs if n < 6 else seqs[:3] if n < 12 else seqs[:1], False)
    return seqs


def test_graph_staging_pads_batches_without_touching_other_blocks(monkeypatch):
    """The static-buffer staging of DecodeGraphs (padding rows, scratch block, width buckets), checked on the CPU
    with an eager stand-in for the captured graph."""
    monkeypatch.setattr(DecodeGraphs, "_capture", lambda self, *key: ((g := _EagerGraph(self, *key)), g.out))
    model = build("qwen2")
    prompts = prompts_of([3, 9, 20, 40, 7])
    graphed, eager = runner_for(model, 128), runner_for(model, 128)
    graphed.target.enforce_eager = False
    for g, e in zip(_shrinking_decode(graphed, prompts), _shrinking_decode(eager, prompts)):
        assert g.completion_ids == e.completion_ids
        assert g.logprobs == pytest.approx(e.logprobs, abs=1e-5)
    assert {bucket for bucket, _, _ in graphed.target.graphs.graphs} == {8, 4, 1}
    assert {width for _, width, _ in graphed.target.graphs.graphs} >= {2, 4}
    for mine, ref in zip(graphed.target.k_caches + graphed.target.v_caches, eager.target.k_caches + eager.target.v_caches):
        torch.testing.assert_close(mine[:128], ref[:128], atol=1e-6, rtol=1e-6)  # padding only hit the scratch


def _burst_vs_single_steps(burst_runner: ModelRunner, step_runner: ModelRunner, lengths: list[int],
                           steps: list[int], params: SamplingParams) -> None:
    prompts = prompts_of(lengths, seed=3)
    blocks = Blocks(burst_runner.num_blocks)
    tables = [blocks.take(4) for _ in prompts]
    burst = [make_seq(i, p, t, params) for i, (p, t) in enumerate(zip(prompts, tables))]
    single = [make_seq(i, p, t, params) for i, (p, t) in enumerate(zip(prompts, tables))]
    step(burst_runner, burst, True)
    step(step_runner, single, True)
    tokens, logprobs = burst_runner.decode(burst, steps)
    for j in range(max(steps)):
        step(step_runner, [s for s, k in zip(single, steps) if k > j], False)
    for seq, toks, lps, ref in zip(burst, tokens, logprobs, single):
        assert toks == ref.completion_ids[1:]
        assert lps == pytest.approx(ref.logprobs[1:], abs=1e-5)
    for mine, theirs in zip(burst_runner.target.k_caches + burst_runner.target.v_caches, step_runner.target.k_caches + step_runner.target.v_caches):
        torch.testing.assert_close(mine[:-1], theirs[:-1], atol=1e-6, rtol=1e-6)  # dead steps hit only the scratch


@pytest.mark.parametrize("graphed", [False, True])
def test_decode_burst_equals_one_step_at_a_time(monkeypatch, graphed):
    """A burst feeds each sampled token back on the device; rows with fewer live steps run dead steps into the
    scratch block. Greedy with uneven steps, and seeded sampling with even ones (the same random draws)."""
    monkeypatch.setattr(DecodeGraphs, "_capture", lambda self, *key: ((g := _EagerGraph(self, *key)), g.out))
    model = build("qwen2")
    for lengths, steps, params in [([3, 17, 30], [5, 1, 3], GREEDY),
                                   ([9, 16, 2], [4, 4, 4], SamplingParams(temperature=0.8, max_tokens=64, seed=5))]:
        burst_runner, step_runner = runner_for(model, 32), runner_for(model, 32)
        burst_runner.target.enforce_eager = not graphed
        _burst_vs_single_steps(burst_runner, step_runner, lengths, steps, params)


def test_decode_burst_rejects_what_would_write_out_of_bounds():
    model = build("qwen2")
    runner = runner_for(model, 8)
    seq = make_seq(0, list(range(3, 18)), [0, 1])
    with pytest.raises(ValueError, match="only 2 blocks"):
        runner.decode([seq], [19])  # positions 14..32: position 32 needs a third block
    with pytest.raises(ValueError, match="block ids outside"):
        runner.decode([make_seq(1, [5, 6], [9])], [1])
    with pytest.raises(ValueError, match="max_model_len"):
        runner.decode([make_seq(2, [5] * 250, list(range(8)))], [10])


# ---------------------------------------------------------------------- GPU only

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_bf16_runner_close_to_hf_on_gpu(arch):
    model = build(arch, dtype=torch.bfloat16, device="cuda")
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK), "cuda")
    runner.allocate_kv_cache(64)
    blocks = Blocks(64)
    seqs = [make_seq(i, p, blocks.take(3)) for i, p in enumerate(prompts_of([5, 17, 30]))]
    generate(runner, seqs, 8)
    for seq in seqs:  # log-probs of the runner's own tokens under HF's forward, within bf16 noise
        logits = full_logits(model, seq.token_ids)
        for j, lp in enumerate(seq.logprobs):
            pos = seq.num_prompt_tokens + j
            assert lp == pytest.approx(torch.log_softmax(logits[pos - 1], -1)[seq.token_ids[pos]].item(), abs=5e-2)


@needs_cuda
@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_cuda_graph_replay_matches_eager_on_gpu(backend):
    model = build("qwen2", device="cuda")
    prompts = prompts_of([3, 9, 20, 40, 7])

    def run(enforce_eager: bool) -> list[Sequence]:
        runner = ModelRunner(model, EngineConfig(block_size=BLOCK, cuda_graphs=not enforce_eager), "cuda", attention_backend=backend)
        runner.allocate_kv_cache(128)
        return _shrinking_decode(runner, prompts)

    graphs, eager = run(False), run(True)
    for g, e in zip(graphs, eager):
        assert g.completion_ids == e.completion_ids
        assert g.logprobs == pytest.approx(e.logprobs, abs=1e-4)


@needs_cuda
def test_graph_replay_sees_in_place_updates_on_gpu():
    """Captured graphs read the parameters by address: an in-place update shows in the next replay."""
    model = build("qwen2", device="cuda")
    prompt = prompts_of([10])[0]
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK), "cuda")
    runner.allocate_kv_cache(32)
    generate(runner, [make_seq(0, prompt, [0, 1])], 6)  # captures the bucket-1 graph
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    after = make_seq(1, prompt, [2, 3])
    generate(runner, [after], 6)
    eager = ModelRunner(model, EngineConfig(block_size=BLOCK, cuda_graphs=False), "cuda")
    eager.allocate_kv_cache(32)
    reference = make_seq(2, prompt, [0, 1])
    generate(eager, [reference], 6)
    assert after.completion_ids == reference.completion_ids


@needs_cuda
def test_recapture_after_cache_reallocation_leaves_no_memory_behind():
    """Each sleep/wake frees the cache and graphs and the next decode captures them again: memory must come back
    to the same level every cycle (a new warm-up stream per capture once kept a cuBLAS workspace per cycle)."""
    model = build("qwen2", device="cuda")
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK), "cuda")
    prompt = prompts_of([10])[0]
    allocated = []
    for cycle in range(4):
        runner.allocate_kv_cache(32)
        generate(runner, [make_seq(cycle, prompt, [0, 1])], 4)
        runner.free_kv_cache()
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    assert allocated[1] == allocated[2] == allocated[3], allocated


@needs_cuda
def test_graphs_parked_over_a_sleep_serve_again_only_where_nothing_they_read_moved():
    """A sleep parks the graphs: after a wake with the pool back at its address they replay (no new capture) and
    decode what an eager runner decodes, an in-place update included; a replaced parameter tensor, or a pool at
    another address, drops them."""
    torch.manual_seed(0)
    model = build("qwen2", device="cuda")
    runner = ModelRunner(model, EngineConfig(block_size=BLOCK), "cuda")
    eager = ModelRunner(model, EngineConfig(block_size=BLOCK, cuda_graphs=False), "cuda")
    eager.allocate_kv_cache(32)
    prompt = prompts_of([10])[0]

    def decode_both(seq_id: int) -> None:
        graphed, reference = make_seq(seq_id, prompt, [0, 1]), make_seq(seq_id, prompt, [0, 1])
        generate(runner, [graphed], 6)
        generate(eager, [reference], 6)
        assert graphed.completion_ids == reference.completion_ids

    runner.allocate_kv_cache(32)
    decode_both(0)
    graphs = runner.target.graphs
    runner.free_kv_cache(keep_graphs=True)
    runner.allocate_kv_cache(32)
    assert runner.target.graphs is graphs  # same pool address: parked graphs serve again
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # in place, as an optimizer step: the graphs read the same tensor
    decode_both(1)
    assert runner.target.graphs is graphs
    runner.free_kv_cache(keep_graphs=True)
    layer = model.model.layers[0].mlp.down_proj
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())  # a replaced tensor: a new address
    runner.allocate_kv_cache(32)
    assert runner.target.graphs is None
    decode_both(2)
    runner.free_kv_cache(keep_graphs=True)
    runner.allocate_kv_cache(48)  # another pool
    assert runner.target.graphs is None
    decode_both(3)



@needs_cuda
def test_a_graph_collected_as_garbage_during_a_capture_does_not_break_it():
    """An engine dropped without close() leaves its graphs in reference cycles (slot -> graphs -> forward -> slot),
    freed whenever the collector runs. Destroying a graph while a stream captures invalidates the capture, so the
    collector must not run in one: here it would, at nearly every allocation, as a cycle becomes garbage inside."""

    class Cycle:
        def __init__(self) -> None:
            self.me, self.graph, self.x = self, torch.cuda.CUDAGraph(), torch.ones(4, device="cuda")
            with torch.cuda.graph(self.graph):
                self.x.add_(1)

    graphs = DecodeGraphs(lambda ids, meta: None, torch.device("cuda"), scratch_block=0, block_size=BLOCK,
                          max_width=4, fixed_width=True, use_triton=False)
    holder, x = [Cycle()], torch.ones(4, device="cuda")
    warmed_up: list[bool] = []

    def body() -> torch.Tensor:
        if warmed_up:  # the capture: the old graph's cycle turns garbage
            holder.clear()
            _ = [[i] for i in range(200_000)]  # enough survivors for a full collection, where the collector is on
        warmed_up.append(True)
        return x * 2

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        graph, out = graphs.capture(body)
    finally:
        gc.set_threshold(*thresholds)
    x.fill_(3)
    graph.replay()
    assert out.tolist() == [6.0] * 4

class _EagerBody:
    """Stands in for a captured sampled burst on the CPU: replay re-runs its steps over the same static buffers."""

    def __init__(self, body) -> None:
        self.body = body
        self.out = body()

    def replay(self) -> None:
        for mine, new in zip(self.out, self.body()):
            mine.copy_(new)


def _seeded_sample(logits: torch.Tensor, temperature: torch.Tensor, seed) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU stand-in of the fused sampler: temperature only, each row's draw keyed by (seed, row) as the
    kernel's (so padding rows change nothing); the seed may be a tensor (in a graph)."""
    out = [sample_tokens(logits[i:i + 1], temperature[i:i + 1], torch.ones(1), torch.zeros(1, dtype=torch.long),
                         torch.Generator().manual_seed((int(seed) * 4099 + i) % 2**62), apply_filters=False)
           for i in range(len(logits))]
    return torch.cat([t for t, _ in out]), torch.cat([lp for _, lp in out])


