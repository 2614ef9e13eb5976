"""A GGUF file (llama.cpp's format) as a model source: `model.name_or_path = "path/to/model.gguf"`.

transformers reads GGUF through the `gguf` package (`pip install "tandemrl[gguf]"`) and dequantises every tensor,
but the model it returns is flagged as quantised (`hf_quantizer`, `config.quantization_config`), which blocks
training and `save_pretrained`. `load_gguf_model` therefore rebuilds a plain model from the file's config and
loads the dequantised state dict into it: an ordinary trainable `*ForCausalLM` whose checkpoints are standard
Hugging Face directories.

The tokenizer comes from the file's metadata. Where the file names a wrong end-of-sequence token (the token that
closes an assistant turn in its chat template, e.g. `<|im_end|>` for ChatML models such as SmolLM2), generation
would run past the end of the answer: `fix_end_of_turn` points eos at the turn's end token and logs the change.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tandemrl.models.load_errors import DTYPE_KWARG, ModelLoadError

logger = logging.getLogger(__name__)

_PROBE = "tandemrl-probe-7f3a"  # a message text no template adds itself, to find what follows a message


class GGUFLoadError(ModelLoadError):
    """A GGUF file could not be loaded, for a reason the user can fix; the message says how."""


def _split(path_str: str) -> tuple[str, str]:
    """(directory, file name) as transformers' `gguf_file=` loading wants them; checks the file and the package."""
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise GGUFLoadError(f"{path} does not exist: no such GGUF file (model.name_or_path)")
    try:
        import gguf  # noqa: F401  - transformers needs it; fail here with the fix rather than deep inside
    except ImportError as exc:
        raise GGUFLoadError(
            f"{path} is a GGUF file, which needs the `gguf` package: pip install 'tandemrl[gguf]' (or pip install "
            "gguf; it is pure Python and needs no network at run time)"
        ) from exc
    return str(path.resolve().parent), path.name


def load_gguf_model(path: str, *, dtype: torch.dtype, attn_implementation: str | None = None) -> PreTrainedModel:
    """The GGUF's weights, dequantised, in a plain (unquantised, trainable) model of `dtype`, on the CPU."""
    directory, name = _split(path)
    try:
        quantised = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, **{DTYPE_KWARG: torch.float32})
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise GGUFLoadError(f"could not load the GGUF file {path}: {' '.join(str(exc).split())}") from exc
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised: saving must not claim otherwise
    kwargs = {DTYPE_KWARG: dtype, **({"attn_implementation": attn_implementation} if attn_implementation else {})}
    model = AutoModelForCausalLM.from_config(config, **kwargs)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if unexpected or set(missing) - tied:
        raise GGUFLoadError(f"{path}: the rebuilt {type(model).__name__} does not match the file's tensors "
                            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    model.tie_weights()
    model.generation_config = quantised.generation_config
    model.config.name_or_path = str(Path(path).expanduser().resolve())
    return model


def load_gguf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer stored in the GGUF's metadata, with its end-of-turn token fixed (see `fix_end_of_turn`)."""
    directory, name = _split(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except (ValueError, OSError, KeyError) as exc:
        raise GGUFLoadError(f"could not read the tokenizer of the GGUF file {path}: {' '.join(str(exc).split())}") \
            from exc
    for fix in fix_end_of_turn(tokenizer):
        logger.warning("%s: %s", Path(path).name, fix)
    return tokenizer


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The special token the chat template writes right after a message's text (`<|im_end|>` in ChatML), or None
    when there is no template or no single special token there."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": _PROBE}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render a plain user message tells us nothing
        return None
    after = text.split(_PROBE, 1)[1] if _PROBE in text else ""
    specials = sorted(set(tokenizer.all_special_tokens) | set(getattr(tokenizer, "added_tokens_encoder", {})),
                      key=len, reverse=True)
    return next((token for token in specials if token and after.startswith(token)), None)


def fix_end_of_turn(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Make eos the chat template's end-of-turn token, and give the tokenizer a pad token; return what changed."""
    fixes = []
    turn_end = end_of_turn_token(tokenizer)
    if turn_end is not None and tokenizer.eos_token != turn_end:
        old = f"{tokenizer.eos_token!r} (id {tokenizer.eos_token_id})"
        tokenizer.eos_token = turn_end
        fixes.append(f"eos token {old} -> {turn_end!r} (id {tokenizer.eos_token_id}), the token that ends a turn in "
                     "the file's chat template")
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        fixes.append(f"pad token unset -> {tokenizer.pad_token!r} (the eos token)")
    return fixes


def align_generation_eos(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Let the model's generation config stop on the tokenizer's eos too (HF generate reads only the model's)."""
    config = model.generation_config
    current = config.eos_token_id
    ids = [] if current is None else [current] if isinstance(current, int) else list(current)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        config.eos_token_id = [tokenizer.eos_token_id, *ids] if ids else tokenizer.eos_token_id
