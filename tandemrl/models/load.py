"""Load a decoder-only causal LM and its tokenizer from a local Hugging Face directory, a hub id or a `.gguf` file
(tandemrl.models.gguf: dequantised into a plain trainable model).

Errors a user can fix come out as `ModelLoadError` (a ValueError) that say what was expected and what to do:
a directory without config.json, a path that does not exist, a hub id that cannot be fetched, a model that is not
a decoder-only causal LM.

KV cache and gradient checkpointing: `load_model(..., gradient_checkpointing=True)` enables non-reentrant
checkpointing but leaves `model.config.use_cache` as it is, because the rollout (`generate`) needs the cache.
Training forwards must pass `use_cache=False` themselves (tandemrl.train.logprobs does).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from tandemrl.models.load_errors import DTYPE_KWARG, ModelLoadError
from tandemrl.models.tokenizer import restore_unk
from tandemrl.models.varlen_attention import VARLEN, register_varlen_attention
from tandemrl.models.weight_files import check_weight_files

TINY_HINT = "pass a local directory, or run `tandemrl make-tiny-model DIR`"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "name" or "org/name", as huggingface_hub allows
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" means cuda when available, else cpu; anything else is checked against what this machine has."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"invalid device {device!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {str(device)!r} requested but CUDA is not available; use 'cpu' or 'auto'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {str(device)!r} requested but only {torch.cuda.device_count()} GPU(s) exist")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto" means bfloat16 on CUDA (float32 where the GPU has no bf16) and float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}: expected 'auto', 'float32', 'bfloat16' or 'float16'") from None


def resolve_name_or_path(name_or_path: str, *, tiny_dir: str | Path = "runs/tiny-model", tiny_seed: int = 0) -> str:
    """The config's model name: "tiny" builds the offline tiny model into `tiny_dir` once and returns that path."""
    if name_or_path == "tiny":
        from tandemrl.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model(Path(tiny_dir), seed=tiny_seed))
    return name_or_path


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~"))
        or (os.sep != "/" and os.sep in name)
        or (os.altsep is not None and os.altsep != "/" and os.altsep in name)
        or not _HUB_ID.match(name)
    )


def _source(name_or_path: str | os.PathLike, required: tuple[str, ...], what: str) -> tuple[str, bool]:
    """(the string to give from_pretrained, whether it is a local directory); raises for bad local paths."""
    name = os.fspath(name_or_path)
    if not name:
        raise ModelLoadError(f"empty model name: {TINY_HINT}")
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file, not a Hugging Face model directory ({TINY_HINT})")
        if not any((path / f).is_file() for f in required):
            raise ModelLoadError(f"{path} has no {required[0]}: not a Hugging Face model directory ({what})")
        return str(path), True
    if _looks_like_path(name):
        raise ModelLoadError(f"{name} does not exist: no such model directory ({TINY_HINT})")
    return name, False


def _hub_error(name: str, exc: BaseException) -> ModelLoadError:
    detail = " ".join(str(exc).split())
    also = f" (and there is no local directory {name!r} either)" if "/" in name else ""
    return ModelLoadError(f"could not load {name!r} from the Hugging Face hub{also}: {detail} — {TINY_HINT}")


def load_config(name_or_path: str, *, trust_remote_code: bool = False) -> transformers.PretrainedConfig:
    src, local = _source(name_or_path, ("config.json",), "expected config.json, model.safetensors ...")
    try:
        return AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    except OSError as exc:
        if not local:
            raise _hub_error(src, exc) from exc
        raise ModelLoadError(f"could not read {Path(src) / 'config.json'}: {exc}") from exc
    except ValueError as exc:  # unknown model_type, or remote code that was not trusted
        raise ModelLoadError(
            f"{src}: {' '.join(str(exc).split())} (transformers {transformers.__version__}; a model that ships its "
            "own code needs trust_remote_code=True)"
        ) from exc


def load_model(
    name_or_path: str,
    *,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    gradient_checkpointing: bool = False,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A decoder-only causal LM on `device` in `dtype` ("auto": bf16 on CUDA, float32 on CPU), in eval mode.

    `use_cache` is left on even with gradient_checkpointing (see the module docstring).
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if attn_implementation == VARLEN:
        register_varlen_attention()  # tandemrl's own: transformers learns the name before it is asked for
    if _is_gguf(name_or_path):
        from tandemrl.models.gguf import load_gguf_model

        model = load_gguf_model(os.fspath(name_or_path), dtype=torch_dtype, attn_implementation=attn_implementation)
        return _place(model, torch_device, gradient_checkpointing)
    config = load_config(name_or_path, trust_remote_code=trust_remote_code)
    src, local = _source(name_or_path, ("config.json",), "expected config.json, model.safetensors ...")
    remote_causal = trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING and not remote_causal:
        raise _not_causal(src, config)
    kwargs = {DTYPE_KWARG: torch_dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if local:
        check_weight_files(Path(src))  # a truncated file: one line naming it, before from_pretrained's traceback
    try:
        model = AutoModelForCausalLM.from_pretrained(src, config=config, **kwargs)
    except OSError as exc:
        if not local:
            raise _hub_error(src, exc) from exc
        raise ModelLoadError(
            f"could not load the weights in {src}: {' '.join(str(exc).split())} (expected model.safetensors, "
            "model.safetensors.index.json + shards, or pytorch_model.bin)"
        ) from exc
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise _not_causal(src, config) from exc
        raise
    return _place(model, torch_device, gradient_checkpointing)


def _place(model: PreTrainedModel, device: torch.device, gradient_checkpointing: bool) -> PreTrainedModel:
    model.to(device)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.eval()
    return model


def _is_gguf(name_or_path: str | os.PathLike) -> bool:
    """A llama.cpp GGUF file (tandemrl.models.gguf loads it), told apart by its suffix."""
    return os.fspath(name_or_path).lower().endswith(".gguf")


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant activation checkpointing; `use_cache` is left alone (pass use_cache=False when training)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _not_causal(src: str, config) -> ModelLoadError:
    model_type = getattr(config, "model_type", "?")
    return ModelLoadError(
        f"{src} is a {model_type!r} model, which AutoModelForCausalLM cannot load: tandemrl trains decoder-only "
        "causal language models (Qwen2, Llama, Mistral, ...), not encoder or encoder-decoder models"
    )


_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.json", "tokenizer.model")


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The model's tokenizer, padding on the left, with pad_token = eos_token where it had none."""
    if _is_gguf(name_or_path):
        from tandemrl.models.gguf import load_gguf_tokenizer

        src, tokenizer = os.fspath(name_or_path), load_gguf_tokenizer(os.fspath(name_or_path))
    else:
        src, tokenizer = _load_hf_tokenizer(name_or_path, trust_remote_code)
    restore_unk(tokenizer)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"the tokenizer of {src} has neither a pad token nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _load_hf_tokenizer(name_or_path: str, trust_remote_code: bool) -> tuple[str, PreTrainedTokenizerBase]:
    src, local = _source(name_or_path, _TOKENIZER_FILES, "expected tokenizer_config.json, tokenizer.json ...")
    try:
        return src, AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code)
    except OSError as exc:
        if not local:
            raise _hub_error(src, exc) from exc
        raise ModelLoadError(f"could not load the tokenizer in {src}: {' '.join(str(exc).split())}") from exc
