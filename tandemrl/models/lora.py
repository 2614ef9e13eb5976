"""LoRA adapters through peft, and the one way the trainer reaches the underlying *ForCausalLM.

`apply_lora` freezes the base model and leaves only the LoRA matrices trainable. peft zero-initialises LoRA's B
matrix, so the wrapped model computes exactly what the base model did until the first update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn
from transformers import PreTrainedModel

from tandemrl.models.unwrap import unwrap_causal_lm

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraSettings:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))

    @classmethod
    def from_config(cls, cfg: Any) -> LoraSettings:
        """From any object with rank/alpha/dropout/target_modules attributes (e.g. tandemrl.config.LoraConfig)."""
        return cls(
            rank=cfg.rank, alpha=cfg.alpha, dropout=cfg.dropout, target_modules=list(cfg.target_modules)
        )


def apply_lora(model: PreTrainedModel, settings: LoraSettings | None = None) -> nn.Module:
    """Wrap `model` in a peft LoRA model: base weights frozen, LoRA weights trainable. Returns the PeftModel."""
    from tandemrl.extras import require_extra

    require_extra("peft", "lora", "model.lora.enabled = true is set")
    from peft import LoraConfig, get_peft_model

    s = settings or LoraSettings()
    if s.rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {s.rank}")
    if not s.target_modules:
        raise ValueError("LoRA target_modules is empty: name at least one linear layer, e.g. 'q_proj'")
    leaf_names = {name.rsplit(".", 1)[-1] for name, _ in unwrap_causal_lm(model).named_modules()}
    missing = [m for m in s.target_modules if m not in leaf_names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"LoRA target_modules {missing} are not modules of this model; its linear layers: {linear}")
    config = LoraConfig(
        r=s.rank,
        lora_alpha=s.alpha,
        lora_dropout=s.dropout,
        target_modules=list(s.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
