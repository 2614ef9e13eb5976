"""A tiny Qwen2 written as llama.cpp writes Qwen2.5-Coder-0.5B-Instruct's Q4_K_M file: no q/k permutation, q/k/v
biases in float32, an output head stored apart from the embedding, and the file's four quant types: the embedding
Q5_0, the head Q8_0, the attention and gate/up projections Q5_0, `ffn_down` Q6_K in layer 0 and Q4_K in layer 1.
The gguf package cannot quantise to K-quants, so those tensors are random blocks with small finite scales; what a
reader must recover is `dequantize` of the bytes written (`expected`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 256, 2, 4, 2  # FFN = one K-quant super-block per row
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789+-*=?.#ĠĊ")  # Ġ space, Ċ newline
TOKENS = SPECIALS + CHARS + ["12", "<tool_call>"]  # "12": one merge, a BPE needs some; then user-defined
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def _k_blocks(rng: np.random.Generator, rows: int, qtype) -> np.ndarray:
    """Random K-quant rows (one 256-weight super-block each) whose fp16 scales are small and finite."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(rows, block), dtype=np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:  # d, dmin at the start
        raw[:, 0:4] = np.frombuffer(np.array([0.004, 0.002], dtype=np.float16).tobytes(), dtype=np.uint8)
    else:  # Q6_K: d at the end
        raw[:, -2:] = np.frombuffer(np.array([0.0002], dtype=np.float16).tobytes(), dtype=np.uint8)
    return raw


def write_tiny_qwen2_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the file; return the float32 weights a reader must recover, by Hugging Face Qwen2 parameter name."""
    import gguf

    rng = np.random.default_rng(seed)
    q = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2")
    for add, value in ((writer.add_block_count, LAYERS), (writer.add_context_length, 256),
                       (writer.add_embedding_length, HIDDEN), (writer.add_feed_forward_length, FFN),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_rope_freq_base, 1_000_000.0), (writer.add_layer_norm_rms_eps, 1e-6)):
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(CHARS) + 1)
                           + [gguf.TokenType.USER_DEFINED])
    writer.add_token_merges(["1 2"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    expected: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, w: np.ndarray | None, qtype=q.F32, raw: np.ndarray | None = None) -> None:
        if raw is None and qtype != q.F32:
            raw = gguf.quants.quantize(w, qtype)
        if raw is None:
            writer.add_tensor(gguf_name, w)
            expected[hf_name] = w
        else:
            writer.add_tensor(gguf_name, raw, raw_dtype=qtype)
            expected[hf_name] = gguf.quants.dequantize(raw, qtype)

    def normal(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    add("token_embd.weight", "model.embed_tokens.weight", normal(len(TOKENS), HIDDEN, scale=1.0), q.Q5_0)
    add("output.weight", "lm_head.weight", normal(len(TOKENS), HIDDEN), q.Q8_0)
    add("output_norm.weight", "model.norm.weight", 1 + normal(HIDDEN))
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        hf, blk = f"model.layers.{i}", f"blk.{i}"
        add(f"{blk}.attn_norm.weight", f"{hf}.input_layernorm.weight", 1 + normal(HIDDEN))
        add(f"{blk}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", 1 + normal(HIDDEN))
        for proj, rows in (("q_proj", HIDDEN), ("k_proj", KV_HEADS * head_dim), ("v_proj", KV_HEADS * head_dim)):
            add(f"{blk}.{_NAMES[proj]}.weight", f"{hf}.self_attn.{proj}.weight", normal(rows, HIDDEN), q.Q5_0)
            add(f"{blk}.{_NAMES[proj]}.bias", f"{hf}.self_attn.{proj}.bias", normal(rows))
        add(f"{blk}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", normal(HIDDEN, HIDDEN), q.Q5_0)
        add(f"{blk}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", normal(FFN, HIDDEN), q.Q5_0)
        add(f"{blk}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", normal(FFN, HIDDEN), q.Q5_0)
        kq = q.Q6_K if i == 0 else q.Q4_K
        add(f"{blk}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", None, kq, _k_blocks(rng, HIDDEN, kq))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
