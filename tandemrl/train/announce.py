"""What a run says about itself before its first step: the parameters it trains and the features it has on, so a
setting that took effect (or a LoRA that trains 0.5 % of the model) is seen at once, not found in the curves."""

from __future__ import annotations

from torch import nn

from tandemrl.config import Config


def feature_lines(cfg: Config, model: nn.Module) -> list[str]:
    """One line for the parameters, and one per feature that is on (tandem, speculative decoding, curriculum)."""
    lines = [parameter_line(cfg, model)]
    if cfg.tandem.enabled:
        t = cfg.tandem
        lines.append(f"tandem: {t.selector} selector, p = {t.p} (the trained model's share), frozen model "
                     f"{t.frozen_model or 'a copy of the starting model'}, frozen tokens weigh {t.frozen_token_weight}")
    spec = cfg.rollout.speculative
    if spec.enabled:
        source = f"draft model {spec.draft_model}" if spec.method == "draft" else "n-gram prompt lookup"
        lines.append(f"speculative decoding: {source}, {spec.num_tokens} tokens proposed per round")
    if cfg.curriculum.enabled:
        lines.append(f"curriculum: {cfg.rollout.group_size} rollouts per prompt until the first epoch ends, then "
                     f"{cfg.curriculum.n_buckets} difficulty buckets at most")
    return lines


def parameter_line(cfg: Config, model: nn.Module) -> str:
    """``parameters: 494.0M, trainable 8.8M (1.78 %, LoRA rank 16, alpha 32 on q_proj, ...)``."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    share = 100.0 * trainable / max(total, 1)
    lora = cfg.model.lora
    how = (f", LoRA rank {lora.rank}, alpha {lora.alpha} on {', '.join(lora.target_modules)}" if lora.enabled
           else "")
    return f"parameters: {_millions(total)}, trainable {_millions(trainable)} ({share:.2f} %{how})"


def _millions(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 100_000 else f"{count:,}"
