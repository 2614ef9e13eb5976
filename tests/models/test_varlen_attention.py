"""model.attn_implementation = "varlen": torch's varlen_attn adapted to each of its signatures, the per-sequence
reference, the sequences read off position ids, generation through sdpa's mask, errors naming the setting; on a GPU,
varlen_attn against the reference in bf16."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from tandemrl.models.load import load_model
from tandemrl.models.tiny import make_tiny_model
from tandemrl.models.varlen_attention import (
    VARLEN,
    register_varlen_attention,
    sequences_from_positions,
    varlen_attention_forward,
)
from tandemrl.models.varlen_kernel import (
    Sequences,
    VarlenAttentionError,
    causal_varlen_attention,
    flash_varlen_attention,
    per_sequence_attention,
)

LENGTHS = [5, 1, 9, 3]
QWEN2_HEADS, QWEN2_KV_HEADS, HEAD_DIM = 14, 2, 16  # Qwen2.5-0.5B's grouping (its head_dim is 64)


def _packed(lengths=LENGTHS, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q, k, v = (torch.randn(tokens, heads, HEAD_DIM, generator=gen).to(device, dtype)
               for heads in (QWEN2_HEADS, QWEN2_KV_HEADS, QWEN2_KV_HEADS))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, Sequences(cu, max(lengths))


def _padded_reference(q, k, v, lengths, scale):
    """Each sequence alone through sdpa with the kv heads repeated: what a padded row computes."""
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        ks, vs = (t.repeat_interleave(QWEN2_HEADS // QWEN2_KV_HEADS, 0) for t in (ks, vs))
        weights = (qs @ ks.transpose(1, 2) * scale).masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
        outs.append((weights.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


def test_the_per_sequence_reference_is_causal_attention_within_each_sequence_with_grouped_heads():
    q, k, v, sequences = _packed()
    out = causal_varlen_attention(q, k, v, sequences, scale=0.3)  # CPU: the reference
    torch.testing.assert_close(out, _padded_reference(q, k, v, LENGTHS, 0.3), atol=1e-5, rtol=1e-5)


# Stand-ins for varlen_attn's signatures across torch releases, computing as the kernel does (1/sqrt(D) unless told)
def _varlen_2_9(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert is_causal and key.shape[1] == query.shape[1] and cu_seq_k is cu_seq_q
    return per_sequence_attention(query, key, value, Sequences(cu_seq_q, max_q), query.shape[-1] ** -0.5)


def _varlen_window(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                   window_size=(-1, -1), k_cache=None):
    assert window_size == (-1, 0) and key.shape[1] == query.shape[1]
    return per_sequence_attention(query, key, value, Sequences(cu_seq_q, max_q), scale)


def _varlen_gqa(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False, seqused_k=None):
    assert window_size == (-1, 0) and enable_gqa and key.shape[1] == QWEN2_KV_HEADS
    return per_sequence_attention(query, key, value, Sequences(cu_seq_q, max_q), scale)


@pytest.mark.parametrize("varlen_attn", [_varlen_2_9, _varlen_window, _varlen_gqa])
def test_each_varlen_attn_signature_gets_causal_masking_the_models_scale_and_grouped_heads(varlen_attn):
    q, k, v, sequences = _packed()
    out = flash_varlen_attention(varlen_attn, q, k, v, sequences, scale=0.3)
    torch.testing.assert_close(out, _padded_reference(q, k, v, LENGTHS, 0.3), atol=1e-5, rtol=1e-5)


def test_a_varlen_attn_that_cannot_be_made_causal_is_refused_naming_the_setting():
    def full_attention_only(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        raise AssertionError("must not be called")

    with pytest.raises(VarlenAttentionError, match=r"model.attn_implementation = 'varlen'.*neither window_size"):
        flash_varlen_attention(full_attention_only, *_packed(), scale=0.3)


def test_sequences_start_at_each_row_and_wherever_positions_restart():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    packed = sequences_from_positions(positions, rows=1, length=9, device=torch.device("cpu"))
    assert packed.cu_seq_lens.tolist() == [0, 3, 5, 9] and packed.max_length == 4
    rows = sequences_from_positions(None, rows=3, length=4, device=torch.device("cpu"))
    assert rows.cu_seq_lens.tolist() == [0, 4, 8, 12] and rows.max_length == 4


class _Attention(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("asks", [{"dropout": 0.1}, {"sliding_window": 64}])
def test_what_varlen_does_not_compute_is_refused_naming_the_setting(asks):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(VarlenAttentionError, match="model.attn_implementation = 'varlen'"):
        varlen_attention_forward(_Attention(), q, q, q, None, **asks)


def _tiny_pair():
    """The same random Qwen2 (4 query heads, 2 kv heads) as varlen and as sdpa."""
    register_varlen_attention()
    config = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    varlen = AutoModelForCausalLM.from_config(Qwen2Config(**config), dtype=torch.float32, attn_implementation=VARLEN)
    sdpa = AutoModelForCausalLM.from_config(Qwen2Config(**config), dtype=torch.float32, attn_implementation="sdpa")
    sdpa.load_state_dict(varlen.state_dict())
    return varlen.eval(), sdpa.eval()


def test_a_packed_forward_without_offsets_reads_the_sequences_off_the_position_ids():
    varlen, sdpa = _tiny_pair()
    first, second = torch.randint(1, 97, (1, 6)), torch.randint(1, 97, (1, 3))
    packed = varlen.model(input_ids=torch.cat([first, second], 1),
                          position_ids=torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2]])).last_hidden_state
    alone = torch.cat([sdpa.model(input_ids=first).last_hidden_state, sdpa.model(input_ids=second).last_hidden_state], 1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_generation_with_left_padding_and_a_cache_matches_sdpa():
    """Hugging Face generate (the hf backend): padded rows and cached decoding run through sdpa's mask."""
    varlen, sdpa = _tiny_pair()
    prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    settings = dict(attention_mask=torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]), max_new_tokens=6,
                    do_sample=False, pad_token_id=0)
    assert varlen.generate(prompts, **settings).tolist() == sdpa.generate(prompts, **settings).tolist()


def test_the_loader_registers_varlen(tmp_path):
    model = load_model(str(make_tiny_model(tmp_path / "tiny")), device="cpu", attn_implementation=VARLEN)
    assert model.config._attn_implementation == VARLEN


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_varlen_attn_matches_the_per_sequence_reference_in_bf16_forward_and_backward():
    """varlen_attn (bf16) and the per-sequence sdpa reference (bf16) against the reference in float32: varlen_attn's
    error in the output and in each gradient stays within twice the bf16 reference's own (or 1 % of the largest)."""
    lengths = [700, 1, 33, 2048, 129, 511]
    q, k, v, sequences = _packed(lengths, device="cuda", seed=1)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to("cuda")
    scale = HEAD_DIM**-0.5 * 0.9
    runs = {}
    for name, attend, dtype in (("varlen_attn", causal_varlen_attention, torch.bfloat16),
                                ("sdpa bf16", per_sequence_attention, torch.bfloat16),
                                ("sdpa fp32", per_sequence_attention, torch.float32)):
        leaves = [t.to(dtype, copy=True).requires_grad_() for t in (q, k, v)]
        out = attend(*leaves, sequences, scale)
        out.backward(grad.to(dtype))
        runs[name] = [out.float(), *(t.grad.float() for t in leaves)]
    for i, what in enumerate(("output", "dq", "dk", "dv")):
        truth = runs["sdpa fp32"][i]
        largest = truth.abs().max()
        flash_error = (runs["varlen_attn"][i] - truth).abs().max() / largest
        bf16_error = (runs["sdpa bf16"][i] - truth).abs().max() / largest
        assert flash_error <= max(2 * bf16_error, 0.01), (what, float(flash_error), float(bf16_error))
