"""``model.compile``: the compiled update equals the eager one, compiles once for every micro-batch length, shares
the model's weights, leaves no-grad forwards eager, and traces the varlen GPU call in one graph.

The CPU runs here compile with the ``aot_eager`` backend (the autograd graphs inductor would get, run by eager
kernels), and one with inductor itself (its C++ code generation takes the better part of a minute per graph on a
CPU); bench/gpu_mfu.sh runs inductor on the GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tandemrl.models.compile import (
    CompileError,
    compile_decoder_layers,
    compile_training_forward,
    has_compiled_layers,
)
import tandemrl.models.varlen_attention as varlen_attention
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.models.varlen_attention import VARLEN
from tandemrl.models.varlen_kernel import Sequences, flash_varlen_attention, torch_varlen_attn
from tests.train.test_update import _assert_same_deltas, _batch, _model, _update_delta


def _compiled(model, backend: str | CompileCounterWithBackend = "aot_eager"):
    compile_decoder_layers(model, backend=backend)
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(("attn", "backend"), [("sdpa", "aot_eager"), (VARLEN, "aot_eager"), ("sdpa", "inductor")])
def test_the_compiled_update_equals_the_eager_update(attn, backend):
    train = dict(aggregation="seq-mean-token-mean", kl_beta=0.1, max_tokens_per_micro_batch=40)
    eager = _update_delta(_model(attn=attn), _batch(), **train)
    compiled = _update_delta(_compiled(_model(attn=attn), backend), _batch(), **train)
    _assert_same_deltas(compiled, eager)
    assert any(delta.abs().max() > 0 for delta in compiled.values())


@pytest.mark.parametrize("attn", ["sdpa", VARLEN])
def test_micro_batches_of_new_lengths_do_not_recompile(attn):
    counter = CompileCounterWithBackend("aot_eager")
    model = _compiled(_model(attn=attn), counter)
    _update_delta(model, _batch(seed=0), max_tokens_per_micro_batch=40)
    after_first = counter.frame_count
    assert after_first > 0
    lengths = set()
    for seed, budget in ((1, 23), (2, 37), (3, 61), (4, 90)):
        batch = _batch(seed=seed, rows=6 + seed)
        lengths.add(int(batch.attention_mask.sum()))
        _update_delta(model, batch, max_tokens_per_micro_batch=budget)
    assert len(lengths) > 2
    assert counter.frame_count == after_first


def test_compiled_layers_share_the_weights_and_no_grad_forwards_run_eagerly():
    counter = CompileCounterWithBackend("aot_eager")
    model = _model()
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    _compiled(model, counter)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == pointers
    assert list(model.state_dict()) == keys  # checkpoints save and load as before
    assert all(layer._compiled_call_impl is None for layer in copy.deepcopy(model).model.layers)  # the reference
    assert has_compiled_layers(model) and not has_compiled_layers(copy.deepcopy(model))
    assert not has_compiled_layers(_model())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        eager_logits = model(input_ids=ids).logits
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert counter.frame_count == 0  # generation and no-grad log-probs are not compiled
    torch.testing.assert_close(model(input_ids=ids).logits, eager_logits)
    assert counter.frame_count > 0


def test_the_compiled_update_equals_the_eager_update_under_gradient_checkpointing():
    """The checkpointed layer's recompute in the backward runs compiled as its forward did."""
    def checkpointed(model):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.train()

    eager = _update_delta(checkpointed(_model()), _batch())
    compiled = _update_delta(_compiled(checkpointed(_model())), _batch())
    _assert_same_deltas(compiled, eager)


def test_the_compiled_update_trains_a_lora_adapter_as_the_eager_one():
    settings = LoraSettings(rank=4, alpha=8)
    eager = _update_delta(apply_lora(_model(), settings), _batch())
    compiled = _update_delta(_compiled(apply_lora(_model(), settings)), _batch())
    _assert_same_deltas(compiled, eager)


def test_torchrun_is_refused_naming_the_key():
    with pytest.raises(CompileError, match="model.compile"):
        compile_training_forward(_model(), distributed=True)


def test_the_varlen_gpu_call_traces_into_one_graph_with_symbolic_lengths():
    """torch's varlen_attn (a custom op with a fake kernel) traced on CPU tensors, fullgraph: no graph break, and the
    longest length stays a graph input (a SymInt) instead of a constant the graph is specialised on."""
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        raise _Traced()

    def attention(query, key, value, cu_seq_lens, longest):
        return flash_varlen_attention(torch_varlen_attn(), query, key, value, Sequences(cu_seq_lens, longest), 0.3)

    query, key = torch.randn(10, 4, 8, dtype=torch.bfloat16), torch.randn(10, 2, 8, dtype=torch.bfloat16)
    compiled = torch.compile(attention, backend=capture, fullgraph=True, dynamic=True)
    with pytest.raises(Exception) as raised:  # the kernel itself is CUDA only: stop once the graph is traced
        compiled(query, key, key, torch.tensor([0, 3, 10], dtype=torch.int32), 7)
    assert "_Traced" in str(raised.value)
    (graph,) = graphs
    calls = [node for node in graph.graph.nodes if node.op == "call_function"]
    assert any("varlen_attn" in str(node.target) for node in calls)
    assert not any(node.args and 7 in node.args for node in calls)


def test_a_training_decoder_layer_with_varlen_attention_traces_into_one_graph(monkeypatch):
    """The whole Qwen2 layer in training mode (its dropout a symbolic float under dynamic=True) as model.compile
    traces it, fullgraph: a graph break anywhere (there were five, around the attention) fails the trace."""
    def gpu_call(query, key, value, sequences, scale):  # the CUDA branch, traced on CPU tensors
        return flash_varlen_attention(torch_varlen_attn(), query, key, value, sequences, scale)

    monkeypatch.setattr(varlen_attention, "causal_varlen_attention", gpu_call)
    model = _model(attn=VARLEN).to(torch.bfloat16).train()
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        raise _Traced()

    layer = torch.compile(model.model.layers[0], backend=capture, fullgraph=True, dynamic=True)
    hidden = torch.randn(1, 10, model.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 5, 6]])
    offsets = torch.tensor([0, 3, 10], dtype=torch.int32)
    with pytest.raises(Exception) as raised:
        layer(hidden, position_embeddings=model.model.rotary_emb(hidden, positions), position_ids=positions,
              cu_seq_lens_q=offsets, cu_seq_lens_k=offsets, max_length_q=7, max_length_k=7)
    assert "_Traced" in str(raised.value)
    assert len(graphs) == 1


class _Traced(Exception):
    pass
