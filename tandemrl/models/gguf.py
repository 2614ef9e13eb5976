"""A GGUF file (llama.cpp's format) as a model source: `model.name_or_path = "path/to/model.gguf"`.

transformers reads GGUF through the `gguf` package (`pip install "tandemrl[gguf]"`) and dequantises every tensor,
but the model it returns is flagged as quantised (`hf_quantizer`, `config.quantization_config`), which blocks
training and `save_pretrained`. `load_gguf_model` therefore rebuilds a plain model from the file's config and
loads the dequantised state dict into it: an ordinary trainable `*ForCausalLM` whose checkpoints are standard
Hugging Face directories.

The tokenizer comes from the file's metadata. Where the file names a wrong end-of-sequence token (the token that
closes an assistant turn in its chat template, e.g. `<|im_end|>` for ChatML models such as SmolLM2), generation
would run past the end of the answer: `fix_end_of_turn` points eos at the turn's end token and logs the change.
Where transformers' converter leaves out tokens the file marks control or user-defined (its Qwen2 converter, in
5.17 for one, registers 3 of Qwen2.5's 22), text holding one, such as `<tool_call>`, would be split into pieces:
`register_file_tokens` makes each a single token again, as llama.cpp and Qwen's own tokenizer read it.
"""

from __future__ import annotations

import logging
import mmap
import struct
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tandemrl.models.load_errors import DTYPE_KWARG, ModelLoadError

logger = logging.getLogger(__name__)

_PROBE = "tandemrl-probe-7f3a"  # a message text no template adds itself, to find what follows a message
_CONTROL, _USER_DEFINED = 3, 4  # gguf.TokenType: tokens a tokenizer must never split
_UINT32, _INT32, _STRING, _ARRAY = 4, 5, 8, 9  # GGUF value types; the sizes of the fixed-size ones:
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


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
    added = register_file_tokens(tokenizer, file_tokens(path))
    if added:
        logger.warning("%s: %d tokens the file marks control or user-defined are now single tokens (%s%s)",
                       Path(path).name, len(added), ", ".join(added[:3]), ", ..." if len(added) > 3 else "")
    return tokenizer


def _skip(buf: mmap.mmap, pos: int, vtype: int) -> tuple[int, list[tuple[int, int]] | None]:
    """Position after one GGUF value at `pos`, and for an array of strings their (offset, length) spans."""
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n, None
    if vtype != _ARRAY:
        return pos + _SCALAR_SIZE[vtype], None
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item != _STRING:
        return pos + count * _SCALAR_SIZE[item], None
    spans = []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", buf, pos)
        spans.append((pos + 8, n))
        pos += 8 + n
    return pos, spans


def file_tokens(path: str) -> list[tuple[int, str, bool]]:
    """(id, text, special) of each token the file marks control (special) or user-defined (not special). Reads the
    header alone (gguf's GGUFReader parses every field: half a minute for a 151k vocabulary)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            return []
        (kv_count,) = struct.unpack_from("<Q", buf, 16)
        pos, tokens, types_at = 24, None, None
        for _ in range(kv_count):
            (n,) = struct.unpack_from("<Q", buf, pos)
            key = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8")
            (vtype,) = struct.unpack_from("<I", buf, pos + 8 + n)
            start = pos + 12 + n
            pos, value = _skip(buf, start, vtype)
            if key == "tokenizer.ggml.tokens":
                tokens = value
            elif key == "tokenizer.ggml.token_type" and struct.unpack_from("<I", buf, start)[0] in (_UINT32, _INT32):
                types_at = start + 12  # an array of (u)int32
            if tokens is not None and types_at is not None:
                break
        if not isinstance(tokens, list) or types_at is None:
            return []
        kinds = struct.unpack_from(f"<{len(tokens)}i", buf, types_at)
        return [(i, bytes(buf[o:o + n]).decode("utf-8"), kind == _CONTROL)
                for i, ((o, n), kind) in enumerate(zip(tokens, kinds)) if kind in (_CONTROL, _USER_DEFINED)]


def register_file_tokens(tokenizer: PreTrainedTokenizerBase, tokens: list[tuple[int, str, bool]]) -> list[str]:
    """Make each (id, text, special) a token the tokenizer never splits, where the vocabulary holds it under that id
    and it is not an added token yet; return the texts added. The vocabulary does not grow."""
    from tokenizers import AddedToken

    known = set(getattr(tokenizer, "added_tokens_encoder", {}))
    todo = [(text, special) for token_id, text, special in tokens
            if text not in known and tokenizer.convert_tokens_to_ids(text) == token_id]
    for special in (True, False):
        batch = [AddedToken(text, special=special, normalized=False) for text, s in todo if s == special]
        if batch:
            tokenizer.add_tokens(batch, special_tokens=special)
    return [text for text, _ in todo]


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
