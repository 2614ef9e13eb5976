"""The decoder forward over a Hugging Face model's own submodules, with paged attention in place of HF's.

Fast path for Qwen2/Qwen2.5, Qwen3 and Llama/Mistral. Every weight is used by calling the module that owns it
(embed_tokens, q_proj, ..., mlp, norm, lm_head), so parameters are read in place (zero copy), an optimizer step
is seen by the next forward, and peft LoRA layers (which replace q_proj etc. by modules whose forward adds the
adapter) just work. Tokens are packed: hidden states are [N, hidden] for N tokens across all sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tandemrl.engine.attention import DecodeMeta, PrefillMeta, decode_attention, prefill_attention, store_kv
from tandemrl.models.lora import unwrap_causal_lm

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# RoPE variants whose frequencies depend on the batch's longest position (host-side logic, per-batch semantics).
_UNSUPPORTED_ROPE = ("dynamic", "longrope")


@dataclass
class DecoderSpec:
    """The modules and shapes the fast path reads; built once per model by `inspect_decoder`."""

    model_type: str
    embed: nn.Module
    layers: list[nn.Module]
    norm: nn.Module
    lm_head: nn.Module
    rotary: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    windows: list[int | None]  # per layer: sliding window in tokens, or None for full attention
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k, before RoPE
    dtype: torch.dtype
    device: torch.device
    vocab_size: int
    max_position_embeddings: int | None

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def inspect_decoder(model: nn.Module) -> DecoderSpec:
    """Find the fast path's modules in `model` (maybe peft/compile-wrapped); NotImplementedError if unsupported."""
    lm = unwrap_causal_lm(model)
    cfg = lm.config
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(
            f"the engine's fast path supports model_type {SUPPORTED_MODEL_TYPES}, not {model_type!r}; "
            "use the HF backend for this architecture")
    decoder = lm.model
    rotary = decoder.rotary_emb
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if any(name in rope_type for name in _UNSUPPORTED_ROPE):
        raise NotImplementedError(f"rope_type {rope_type!r} ({model_type}) is not supported by the engine's fast path")
    layers = list(decoder.layers)
    attn = layers[0].self_attn
    head_dim = int(getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    embed = decoder.embed_tokens
    return DecoderSpec(
        model_type=model_type,
        embed=embed,
        layers=layers,
        norm=decoder.norm,
        lm_head=lm.get_output_embeddings(),
        rotary=rotary,
        num_heads=int(cfg.num_attention_heads),
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        head_dim=head_dim,
        scale=float(getattr(attn, "scaling", head_dim ** -0.5)),
        windows=[_sliding_window(cfg, layer.self_attn, model_type) for layer in layers],
        qk_norm=model_type == "qwen3",
        dtype=_weight(embed).dtype,
        device=_weight(embed).device,
        vocab_size=int(_weight(embed).shape[0]),
        max_position_embeddings=getattr(cfg, "max_position_embeddings", None),
    )


def _weight(module: nn.Module) -> Tensor:
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, Tensor) else next(module.parameters())


def _sliding_window(cfg, attn: nn.Module, model_type: str) -> int | None:
    """The window the HF attention of this layer applies (Qwen: per layer attribute; Mistral: the config)."""
    if model_type == "mistral":
        window = getattr(cfg, "sliding_window", None)
    elif model_type in ("qwen2", "qwen3"):
        window = getattr(attn, "sliding_window", None)
    else:
        window = None
    return int(window) if window else None


def forward_hidden(
    spec: DecoderSpec, input_ids: Tensor, meta: PrefillMeta | DecodeMeta, k_caches: list[Tensor],
    v_caches: list[Tensor], rows: Tensor | None = None,
) -> Tensor:
    """Run the decoder on packed tokens input_ids [N]; write their K/V to the caches.

    Returns the final-norm hidden states of `rows` (default: all tokens) — the only positions we take logits of.
    """
    hidden = spec.embed(input_ids)
    cos, sin = spec.rotary(hidden, meta.positions.unsqueeze(0))  # [1, N, D], cast to hidden's dtype by HF
    cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [N, 1, D]: broadcast over heads
    for i, layer in enumerate(spec.layers):
        residual = hidden
        x = layer.input_layernorm(hidden)
        x = _self_attention(spec, layer.self_attn, x, cos, sin, k_caches[i], v_caches[i], meta, spec.windows[i])
        hidden = residual + x
        residual = hidden
        hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
    if rows is not None:
        hidden = hidden[rows]
    return spec.norm(hidden)  # a per-row op: normalising only the rows we keep is exact


def compute_logits(spec: DecoderSpec, hidden: Tensor) -> Tensor:
    """[S, hidden] final-norm states -> [S, vocab] logits, through the model's own lm_head."""
    return spec.lm_head(hidden)


def _self_attention(
    spec: DecoderSpec, attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
    meta: PrefillMeta | DecodeMeta, window: int | None,
) -> Tensor:
    N = x.shape[0]
    q = attn.q_proj(x).view(N, spec.num_heads, spec.head_dim)
    k = attn.k_proj(x).view(N, spec.num_kv_heads, spec.head_dim)
    v = attn.v_proj(x).view(N, spec.num_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    if isinstance(meta, PrefillMeta):
        out = prefill_attention(q, k_cache, v_cache, meta, spec.scale, window)
    else:
        out = decode_attention(q, k_cache, v_cache, meta, spec.scale, window)
    return attn.o_proj(out.reshape(N, spec.num_heads * spec.head_dim))


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's rotate-half RoPE: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
