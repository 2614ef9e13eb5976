"""``model.compile``: regional compilation of the training forward, one decoder layer at a time.

Each decoder layer's call is compiled with ``torch.compile(dynamic=True)``: the token count of a packed micro-batch
(and the rows' offsets) are symbolic, so ragged micro-batches reuse one graph, and since torch inlines the layer's
parameters as graph inputs, every layer of one class runs the same compiled code. The compiled call runs only where
autograd records (the training forward and its gradient-checkpointing recompute); under ``torch.no_grad`` (Hugging
Face generate, the old and reference log-probs) the layer runs eagerly as before. The compiled layers are the model's
own modules: parameters, state dicts and the rollout engine's weight tensors are shared, not copied.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tandemrl.models.unwrap import unwrap_causal_lm

COMPILE_KEY = "model.compile"


class CompileError(ValueError):
    """``model.compile`` cannot be combined with what was asked; the message names the key."""


class GradGatedCall:
    """A layer's ``_compiled_call_impl``: the compiled call where autograd records, the eager one elsewhere."""

    def __init__(self, compiled: Callable, eager: Callable) -> None:
        self.compiled, self.eager = compiled, eager

    def __call__(self, *args, **kwargs):
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return self.compiled(*args, **kwargs)
        return self.eager(*args, **kwargs)


def compile_training_forward(model: nn.Module, distributed: bool) -> None:
    """What ``model.compile = true`` does to the policy; refused under torchrun, whose FSDP2 shards (DTensors and
    per-layer hooks) and replicas the compiled layers have not been checked against."""
    if distributed:
        raise CompileError(f"{COMPILE_KEY} runs in a single process for now, not under torchrun "
                           "(distributed.strategy): set model.compile = false")
    compile_decoder_layers(model)


def compile_decoder_layers(model: nn.Module, backend: str | Callable = "inductor") -> None:
    """Compiles each decoder layer of ``model`` (a causal LM, LoRA-wrapped or not) in place, once. A deep copy of
    the model (the reference policy) is eager: nn.Module drops ``_compiled_call_impl`` when copied."""
    for layer in _decoder_layers(unwrap_causal_lm(model)):
        if not isinstance(layer._compiled_call_impl, GradGatedCall):
            # torch.compile of the bound _call_impl, as nn.Module.compile does: hooks and forward run compiled.
            layer._compiled_call_impl = GradGatedCall(
                torch.compile(layer._call_impl, backend=backend, dynamic=True), layer._call_impl)


def has_compiled_layers(causal_lm: nn.Module) -> bool:
    """Whether ``model.compile`` compiled this model's layers (its deep copies are eager): the log-prob head's
    reductions then run compiled too (train/head_logprobs.py)."""
    layers = getattr(causal_lm.get_decoder(), "layers", None)
    return isinstance(layers, nn.ModuleList) and any(isinstance(layer._compiled_call_impl, GradGatedCall)
                                                     for layer in layers)


def _decoder_layers(causal_lm: nn.Module) -> list[nn.Module]:
    layers = getattr(causal_lm.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise CompileError(f"{COMPILE_KEY} compiles the decoder's layers, and {type(causal_lm).__name__}'s decoder "
                           "has no `layers` list: set model.compile = false")
    return list(layers)
