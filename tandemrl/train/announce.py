"""What a run says about itself before its first step: the parameters it trains and the features it has on, so a
setting that took effect (or a LoRA that trains 0.5 % of the model) is seen at once, not found in the curves."""

from __future__ import annotations

from torch import nn

from tandemrl.config import Config
from tandemrl.train.rollouts import PromptEncoder
from tandemrl.types import Sample


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


def unseen_tools_warning(cfg: Config, encoder: PromptEncoder, sample: Sample) -> str | None:
    """A warning when the hermes tool format is on but ``sample``'s prompt, as the model reads it, names none of
    the tools: their descriptions reach the model only through a chat template that renders ``tools=``, so with
    data.use_chat_template = false on text prompts, or a template that ignores them, the model is never told."""
    if cfg.tools.format != "hermes" or not encoder.tools:
        return None
    names = [tool["function"]["name"] for tool in encoder.tools]
    text, _ = encoder.encode(sample)
    if any(name in text for name in names):
        return None
    how = ("data.use_chat_template = false: text prompts are not rendered by the chat template"
           if not (encoder.use_chat_template or isinstance(sample.prompt, list))
           else "the tokenizer's chat template does not render `tools`")
    return (f"tools {', '.join(names)} are never described to the model: the prompt it reads names none of them "
            f"({how}). Set data.use_chat_template = true with a template that renders tools (Qwen2.5's, Hermes'), "
            "describe them in data.system_prompt, or use tools.format = 'plain' with your own instructions.")
