"""The boundary tokens of the sentence and word selectors (selectors.py), read off a tokenizer."""

from __future__ import annotations

import unicodedata
from typing import Any, Literal

SPACE_MARKERS: tuple[str, ...] = ("Ġ", "▁")
SENTENCE_ENDINGS: tuple[str, ...] = (".", "!", "?", "\n")


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


def boundary_ids(tokenizer: Any, kind: Literal["sentence", "word"]) -> frozenset[int]:
    """Token ids after which a sentence / word segment ends, read off a Hugging Face-style tokenizer.

    Every id in ``range(len(tokenizer))`` is looked at except ``tokenizer.all_special_ids`` (EOS / pad end the
    completion anyway). ``text`` = ``tokenizer.decode([id])``, ``piece`` = ``tokenizer.convert_ids_to_tokens(id)``.

    - sentence: ``text.rstrip(" \\t")`` ends with ".", "!", "?" or "\\n" (so "3." counts too: an approximation).
    - word: ``text`` ends with whitespace or a Unicode punctuation character (category P*), OR ``piece`` starts
      with a space marker ("Ġ", "▁") or whitespace, OR ``text`` starts with whitespace.
      Why the "starts" half: byte-level BPE and SentencePiece glue the space to the NEXT word's first token, and a
      selector only decides after a token is written, so a word-initial token is where a switch can happen. With
      it a one-token word (the common case) is exactly one segment; a multi-token word " un|believ|able" is cut
      after its first piece (segments "un" + rest-of-word-with-next-word-start). Tokenizers that put the space at
      the END of a token are covered by the "ends" half.
    """
    if kind not in ("sentence", "word"):
        raise ValueError(f"kind must be 'sentence' or 'word', got {kind!r}")
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    out = set()
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i])
        if kind == "sentence":
            if text.rstrip(" \t").endswith(SENTENCE_ENDINGS):
                out.add(i)
            continue
        piece = tokenizer.convert_ids_to_tokens(i)
        piece = piece if isinstance(piece, str) else ""
        ends = bool(text) and (text[-1].isspace() or _is_punct(text[-1]))
        starts = piece.startswith(SPACE_MARKERS) or piece[:1].isspace() or text[:1].isspace()
        if ends or starts:
            out.add(i)
    return frozenset(out)
