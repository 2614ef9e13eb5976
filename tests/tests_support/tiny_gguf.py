"""Writes a tiny Llama model and the project's character tokenizer as a GGUF file, the way llama.cpp lays one out,
so the GGUF loader is tested without the real SmolLM2 file.

Layout as llama.cpp's converter writes it: GGUF tensor names (`blk.N.attn_q.weight` ...), q/k projection rows
permuted for its rotary layout, the MLP weights quantised to Q4_1 (the real file's type), everything else float32.
The file deliberately names `<|endoftext|>` (id 0) as eos although its ChatML template ends turns with
`<|im_end|>` (id 2): the loader must fix that.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tandemrl.models.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, build_char_tokenizer

Q4_1_TENSORS = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(config).float().eval()


def permute_for_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order of a q/k projection (the pairs of each head interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def q4_1_roundtrip(w: np.ndarray) -> np.ndarray:
    """What a reader recovers from `w` stored as Q4_1."""
    import gguf

    qtype = gguf.GGMLQuantizationType.Q4_1
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)


def write_tiny_gguf(model: LlamaForCausalLM, path: Path) -> Path:
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    _add_tokenizer(writer)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the embedding, which the file stores once
            continue
        _add_tensor(writer, name, tensor.detach().numpy().astype(np.float32), cfg)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer) -> None:
    import gguf

    tokenizer = build_char_tokenizer()
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL
                            for t in tokens])
    writer.add_token_scores([0.0] * len(tokens))  # one token per character: no merges, a reader derives none
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)  # wrong on purpose: the template ends a turn with <|im_end|> (2)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _add_tensor(writer, name: str, w: np.ndarray, cfg: LlamaConfig) -> None:
    import gguf

    if name == "model.embed_tokens.weight":
        writer.add_tensor("token_embd.weight", w)
        return
    if name == "model.norm.weight":
        writer.add_tensor("output_norm.weight", w)
        return
    _, _, layer, *rest = name.split(".")  # model.layers.N.<module>.weight
    module = ".".join(rest[:-1])
    if module == "self_attn.q_proj":
        w = permute_for_rope(w, cfg.num_attention_heads)
    elif module == "self_attn.k_proj":
        w = permute_for_rope(w, cfg.num_key_value_heads)
    target = f"blk.{layer}.{_NAMES[module]}.weight"
    if module in Q4_1_TENSORS:
        qtype = gguf.GGMLQuantizationType.Q4_1
        writer.add_tensor(target, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(target, w)
