"""peft LoRA Linear layers as the grouped projections read them: the base nn.Linear and one adapter's A, B and
scaling, all peft's own parameter tensors (read in place: an optimizer step on the adapter is seen by the next
rollout; nothing merged, nothing copied).

peft computes ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling`` (x cast to the adapter's dtype, the sum
cast back to the base's); fused_linear.py computes the same next to the base projection. Only that plain case is
taken: peft is recognised by its attributes (this layer imports nothing of it), and anything else (merged or
disabled adapters, several active ones, DoRA and other variants, dropout in training, hooks, biased or odd A/B)
returns None and the module runs itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

_PEFT_ATTRIBUTES = ("base_layer", "lora_A", "lora_B", "scaling", "lora_dropout", "merged", "disable_adapters",
                    "active_adapters")


@dataclass(frozen=True)
class LoraParts:
    """One LoRA Linear's operands: y = base(x) + (x @ a.T) @ b.T * scaling."""

    base: nn.Module  # the wrapped layer (the caller checks it is a plain nn.Linear)
    a: Tensor  # [rank, in_features]
    b: Tensor  # [out_features, rank]
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


def lora_parts(module: nn.Module, x: Tensor) -> LoraParts | None:
    """The parts of a peft LoRA Linear in its plain state for input x, else None (see the module docstring)."""
    if not all(hasattr(module, name) for name in _PEFT_ATTRIBUTES) or _hooked(module):
        return None
    if module.merged or module.disable_adapters:
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    if len(active) != 1:
        return None
    name = active[0]
    if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name, False):
        return None  # DoRA and other variants compute more than B A x
    lora_a, lora_b, dropout = module.lora_A[name], module.lora_B[name], module.lora_dropout[name]
    if not (isinstance(dropout, nn.Identity) or not dropout.training) or _hooked(dropout):
        return None
    if not (_bare_linear(lora_a) and _bare_linear(lora_b)):
        return None
    a, b = lora_a.weight, lora_b.weight
    if a.dtype != b.dtype or a.device != x.device or b.shape[1] != a.shape[0] or a.shape[1] != x.shape[-1]:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or a.requires_grad or b.requires_grad):
        return None  # the kernels record no autograd graph
    return LoraParts(module.base_layer, a, b, float(module.scaling[name]))


def _bare_linear(module: nn.Module) -> bool:
    """An nn.Linear without bias or hooks whose weight is plain contiguous memory."""
    return (isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward and module.bias is None
            and not _hooked(module) and type(module.weight) in (Tensor, nn.Parameter)
            and module.weight.is_contiguous() and module.weight.dtype in (torch.float16, torch.bfloat16,
                                                                          torch.float32))


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)
