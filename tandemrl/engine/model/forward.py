"""The decoder forward over a Hugging Face model's own submodules, with paged attention in place of HF's.

Fast path for Qwen2/Qwen2.5, Qwen3 and Llama/Mistral. Every weight is used by calling the module that owns it
(embed_tokens, q_proj, ..., mlp, norm, lm_head), so parameters are read in place (zero copy), an optimizer step
is seen by the next forward, and peft LoRA layers (which replace q_proj etc. by modules whose forward adds the
adapter) just work. Tokens are packed: hidden states are [N, hidden] for N tokens across all sequences.
The fused path may group plain nn.Linear projections into one Triton launch (fused_linear.py); those kernels
read the same parameter tensors in place, serve peft LoRA layers in their plain state (the adapter's product in
the same launch as the base projection, no merge) and step aside for anything else (hooks, merged or DoRA
adapters), where the module runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.kernels import fused_linear as fl
from tandemrl.engine.kernels import linear_dispatch as dispatch
from tandemrl.engine.kernels.paged_kv import DecodeMeta, PrefillMeta, store_kv
from tandemrl.engine.model.attention import decode_attention, prefill_attention
from tandemrl.models.unwrap import unwrap_causal_lm

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
        vocab_size=int(getattr(embed, "num_embeddings", None) or _weight(embed).shape[0]),  # TP: the whole vocab
        max_position_embeddings=getattr(cfg, "max_position_embeddings", None),
    )


def _weight(module: nn.Module) -> Tensor:
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, Tensor) else next(module.parameters())


def _sliding_window(cfg, attn: nn.Module, model_type: str) -> int | None:
    """The window the HF attention of this layer applies (Qwen: per layer attribute; Mistral: the config)."""
    window = getattr({"mistral": cfg, "qwen2": attn, "qwen3": attn}.get(model_type), "sliding_window", None)
    return int(window) if window else None


def forward_hidden(spec: DecoderSpec, input_ids: Tensor, meta: PrefillMeta | DecodeMeta, k_caches: list[Tensor],
                   v_caches: list[Tensor], rows: Tensor | None = None, fused: bool = False) -> Tensor:
    """Run the decoder on packed tokens input_ids [N]; write their K/V to the caches.

    Returns the final-norm hidden states of `rows` (default: all tokens) — the only positions we take logits of.
    fused: use the Triton kernels of fused.py where they apply (CUDA with Triton only; elsewhere ignored).
    """
    hidden = spec.embed(input_ids)
    cos, sin = spec.rotary(hidden, meta.positions.unsqueeze(0))  # [1, N, D], cast to hidden's dtype by HF
    fused = fused and fk.fused_available(hidden.device)
    # [N, D] on the fused path (which rotates q and k in place); [N, 1, D] on the torch path: broadcast over heads
    cos, sin = (cos[0], sin[0]) if fused else (cos[0].unsqueeze(1), sin[0].unsqueeze(1))
    # Each sublayer's residual add goes into the next norm (one kernel on the fused path): `hidden` is a sublayer's
    # output still to be added to `residual` (None before the first layer).
    residual: Tensor | None = None
    for i, layer in enumerate(spec.layers):
        x, residual = _add_norm(layer.input_layernorm, hidden, residual, fused)
        hidden = _self_attention(spec, layer.self_attn, x, cos, sin, k_caches[i], v_caches[i], meta,
                                 spec.windows[i], fused)
        x, residual = _add_norm(layer.post_attention_layernorm, hidden, residual, fused)
        hidden = _mlp(layer.mlp, x) if fused else layer.mlp(x)
    if rows is not None:  # the final norm is a per-row op: normalising only the rows we keep is exact
        hidden = hidden[rows]
        residual = None if residual is None else residual[rows]
    return _add_norm(spec.norm, hidden, residual, fused)[0]


def _add_norm(norm: nn.Module, x: Tensor, residual: Tensor | None, fused: bool) -> tuple[Tensor, Tensor]:
    """(norm(residual + x), residual + x); one kernel for a plain RMSNorm on the fused path, else the module. Also
    Qwen3's per-head q/k norm (no residual)."""
    if fused and fk.is_plain_rmsnorm(norm):
        return fk.add_rmsnorm(x, residual, norm.weight, norm.variance_epsilon)
    new_residual = x if residual is None else residual + x
    return norm(new_residual), new_residual


def _mlp(mlp: nn.Module, x: Tensor) -> Tensor:
    """A SiLU-gated MLP with its activation product fused: gate/up in the same launch where they are plain
    Linear layers or plain LoRA layers over them, else module calls."""
    if not fk.is_silu_mlp(mlp):
        return mlp(x)
    act = fl.gate_up_silu(mlp, x, max_rows=dispatch.GROUPED_LINEAR_MAX_ROWS)  # one launch for decode batches
    if act is None:  # hooked projections or adapters the kernels do not serve, or prefill-size inputs (cuBLAS)
        act = fk.silu_mul(mlp.gate_proj(x), mlp.up_proj(x))
    return _project(mlp.down_proj, act, fused=True)


def _project(module: nn.Module, x: Tensor, fused: bool) -> Tensor:
    """A projection (o_proj, down_proj): the module call (cuBLAS for a plain Linear), except a peft LoRA Linear on
    the fused path, whose base and adapter run in our launches (fused_linear.lora_projection)."""
    out = fl.lora_projection(module, x, max_rows=dispatch.GROUPED_LINEAR_MAX_ROWS) if fused else None
    return module(x) if out is None else out


def _qkv(attn: nn.Module, x: Tensor, fused: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The q, k, v projections: on the fused path one grouped launch for decode batches (column views of one
    buffer; LoRA adapters included), else the modules themselves (hooks, prefill-size inputs)."""
    grouped = fl.qkv_projection(attn, x, max_rows=dispatch.GROUPED_LINEAR_MAX_ROWS) if fused else None
    return grouped if grouped is not None else (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))


def _self_attention(spec: DecoderSpec, attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor,
                    v_cache: Tensor, meta: PrefillMeta | DecodeMeta, window: int | None, fused: bool = False) -> Tensor:
    """cos, sin: [N, 1, D] on the torch path, [N, D] on the fused path (which rotates q and k in place)."""
    N = x.shape[0]
    q, k, v = _qkv(attn, x, fused)
    q = q.view(N, spec.num_heads, spec.head_dim)
    k = k.view(N, spec.num_kv_heads, spec.head_dim)
    v = v.view(N, spec.num_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q, k = _add_norm(attn.q_norm, q, None, fused)[0], _add_norm(attn.k_norm, k, None, fused)[0]
    if fused:  # RoPE and the K/V cache write in one launch
        fk.rope_qk_store_(q, k, v, cos, sin, k_cache, v_cache, meta.slot_mapping)
    else:
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    if isinstance(meta, PrefillMeta):
        out = prefill_attention(q, k_cache, v_cache, meta, spec.scale, window)
    else:
        out = decode_attention(q, k_cache, v_cache, meta, spec.scale, window)
    return _project(attn.o_proj, out.reshape(N, spec.num_heads * spec.head_dim), fused)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's rotate-half RoPE: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
