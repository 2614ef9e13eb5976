"""The offline character-level tokenizer of the project's tiny model.

Built with the `tokenizers` library, no download: one token per printable ASCII character plus space and newline,
and four special tokens — VOCAB_SIZE == 100.

It is Qwen2's own pipeline (NFC normaliser, Qwen2's split regex, byte-level pre-tokenizer and decoder, BPE) with a
vocabulary of single byte-level characters and no merges, so every token is one character. Why not a plain
character model: transformers 5 loads any directory whose config says `model_type: qwen2` with its Qwen2Tokenizer
class, which ignores tokenizer_config.json's `tokenizer_class` and rebuilds that pipeline around the vocabulary in
tokenizer.json. Spelling the vocabulary byte-level (space is "Ġ", newline "Ċ", as in GPT-2/Qwen vocabularies)
makes the rebuilt tokenizer, the `PreTrainedTokenizerFast` built here and a transformers 4.x / vLLM reading of
tokenizer.json all give the same ids. The byte-level decoder concatenates tokens, so
`decode(encode(text)) == text` for any text made of CHARACTERS.

Unknown characters: tokenizer.json maps each byte of an unknown character to `<unk>`. transformers 5's
Qwen2Tokenizer drops the BPE unk token (unknown bytes vanish); `tandemrl.models.load.load_tokenizer` puts it back.

Ids are fixed by construction (specials first, then the characters in CHARACTERS order):

    0 <|endoftext|>  (eos and pad; also the model's bos id, as in Qwen2 — the tokenizer adds no BOS)
    1 <|im_start|>
    2 <|im_end|>
    3 <unk>
    4.. the characters of CHARACTERS (digits, ASCII letters, punctuation, space, newline)
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, IM_START, IM_END, UNK_TOKEN)
CHARACTERS: str = string.digits + string.ascii_letters + string.punctuation + " \n"
VOCAB_SIZE: int = len(SPECIAL_TOKENS) + len(CHARACTERS)  # 100
MODEL_MAX_LENGTH = 512

# Qwen2's pre-tokenization regex (transformers/models/qwen2/tokenization_qwen2.py).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5-style ChatML, without Qwen's default system prompt or tool-calling sections.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode character table, which the byte-level pre-tokenizer applies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _vocab() -> dict[str, int]:
    byte_char = _bytes_to_unicode()
    tokens = list(SPECIAL_TOKENS) + [byte_char[ord(c)] for c in CHARACTERS]
    assert len(set(tokens)) == len(tokens) == VOCAB_SIZE
    return {token: i for i, token in enumerate(tokens)}


def _backend() -> Tokenizer:
    backend = Tokenizer(models.BPE(vocab=_vocab(), merges=[], unk_token=UNK_TOKEN, fuse_unk=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return backend


def build_char_tokenizer(model_max_length: int = MODEL_MAX_LENGTH) -> PreTrainedTokenizerFast:
    """The character tokenizer as a transformers fast tokenizer (chat template set, padding on the left)."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend(),
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.chat_template = CHAT_TEMPLATE
    if len(tokenizer) != VOCAB_SIZE:  # registering the specials must not have grown the vocabulary
        raise AssertionError(f"char tokenizer has {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    return tokenizer


def restore_unk(tokenizer) -> None:
    """Map unknown bytes to <unk> again where a loader dropped the BPE unk token (transformers 5's Qwen2Tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    if not isinstance(model, models.BPE) or model.unk_token is not None:
        return
    unk = getattr(tokenizer, "unk_token", None)
    if unk == UNK_TOKEN and backend.token_to_id(unk) is not None:
        model.unk_token = unk
        if hasattr(model, "_clear_cache"):  # words encoded before this keep their cached (unk-less) ids otherwise
            model._clear_cache()


def save_char_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save so that transformers 5 and transformers 4.x (e.g. a vLLM environment) both load the directory.

    transformers 5 writes `tokenizer_class: TokenizersBackend` and a list under `extra_special_tokens`, which 4.x
    does not understand, and keeps the chat template only in chat_template.jinja. tokenizer_config.json is
    rewritten with the class name both accept, `additional_special_tokens`, and the chat template inline.
    """
    out_dir = Path(out_dir)
    tokenizer.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("extra_special_tokens", None)
    config.pop("backend", None)
    config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=tokenizer.model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
        chat_template=CHAT_TEMPLATE,
    )
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
