"""The one way to reach the `*ForCausalLM` inside a wrapped model. A leaf (it imports nothing of tandemrl), so the
engine may import it: the engine reads the trainer's model, whatever wraps it (docs/architecture.md)."""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel


def unwrap_causal_lm(model: nn.Module) -> PreTrainedModel:
    """The `*ForCausalLM` inside `model`: itself, or the one inside a peft, DDP/FSDP or torch.compile wrapper.

    Its `get_decoder()` and `get_output_embeddings()` (lm_head) run through any LoRA layers, which peft injects
    into the base model's modules in place.
    """
    seen = 0
    while seen < 8:
        seen += 1
        if isinstance(model, PreTrainedModel) and model.get_output_embeddings() is not None:
            return model
        inner = None
        get_base = getattr(model, "get_base_model", None)  # peft.PeftModel
        if callable(get_base):
            inner = get_base()
        elif hasattr(model, "_orig_mod"):  # torch.compile
            inner = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):  # DDP / FSDP
            inner = model.module
        if inner is None or inner is model:
            break
        model = inner
    raise TypeError(f"expected a causal LM with an lm_head (a *ForCausalLM, maybe peft-wrapped), got {type(model)}")
