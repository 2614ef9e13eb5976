"""Turn one choice's growing token list into text deltas that never have to be taken back.

A stop string may start in text already decoded, so the last ``len(longest stop) - 1`` characters are held back
until more text shows they do not begin one; a trailing U+FFFD (half of a multi-byte character) waits for the
next token. Token ids and log-probs go out with the text they produced, so a client that concatenates the
chunks gets exactly the final completion, cut at the stop string.
"""

from __future__ import annotations

import bisect
from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


WINDOW = 4  # tokens of context decoded in front of a new one: enough for tokenizers whose pieces depend on the left


class ChoiceText:
    """Decodes incrementally: the tokens of one ``add`` cost two decodes of a few tokens (the last ``WINDOW`` before
    them, then those plus the new ones), not of the whole completion, and a stop string is looked for only where new
    text could complete one. With stop strings, or when the new text ends in half a character, the new tokens are
    decoded one by one instead (two decodes each), so that each id goes out with exactly the text it produced."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: tuple[str, ...]) -> None:
        self._decode = decode
        self._holdback = max((len(s) for s in stops), default=1) - 1
        self._stops = stops
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""  # the decoded text of ids[:len(self._ends)] (never ends in half a character)
        self._ends: list[int] = []  # len(self.text) after each decoded id
        self._stopped = False
        self.sent_text = ""
        self.sent_ids = 0  # leading ids whose text has been sent

    def add(self, ids: list[int], logprobs: list[float]) -> tuple[str, list[int], list[float]]:
        """Tokens arrived; returns (text, ids, log-probs) safe to send now."""
        self.ids += ids
        self.logprobs += logprobs
        checked = len(self.text)
        self._decode_new()
        if self._stopped or self._has_stop(checked):
            self._stopped = True
            return "", [], []  # the engine finishes this choice; finish() sends the cut text
        safe = len(self.text) - self._holdback
        return self._send(self.text[:safe] if safe > len(self.sent_text) else self.sent_text)

    def finish(self, final_ids: list[int], final_logprobs: list[float], final_text: str) -> tuple[str, list[int],
                                                                                                    list[float]]:
        """The rollout's final tokens and text (cut at the stop string): what was not sent yet."""
        self.ids, self.logprobs = list(final_ids), list(final_logprobs)
        text = final_text if final_text.startswith(self.sent_text) else self.sent_text
        delta = text[len(self.sent_text):]
        self.sent_text = text
        new_ids, new_lps = self.ids[self.sent_ids:], self.logprobs[self.sent_ids:]
        self.sent_ids = len(self.ids)
        return delta, new_ids, new_lps

    def _decode_new(self) -> None:
        """Extend ``text`` by the ids not decoded yet; an id that ends in half a character waits for the next."""
        done = len(self._ends)
        if len(self.ids) - done > 1 and not self._holdback:  # nothing held back: every id goes out with the text
            start = max(0, done - WINDOW)
            context = self._decode(self.ids[start:done]) if done > start else ""
            if self._extend(start, len(self.ids), context):
                return
        for end in range(done + 1, len(self.ids) + 1):
            start = max(0, done - WINDOW)
            context = self._decode(self.ids[start:done]) if done > start else ""
            if self._extend(start, end, context):
                done = end

    def _extend(self, start: int, end: int, context: str) -> bool:
        """Add the text of ``ids[len(_ends):end]`` (``context``: that of ``ids[start:len(_ends)]``); False, adding
        nothing, if it ends in half a character (it waits for the next id)."""
        piece = self._decode(self.ids[start:end])
        if piece.endswith(REPLACEMENT):
            return False
        if piece.startswith(context):
            self.text += piece[len(context):]
        else:  # the tokenizer rewrote text to the left (e.g. clean-up of spaces): decode it all, as it would
            self.text = self._decode(self.ids[:end])
        self._ends += [len(self.text)] * (end - len(self._ends))  # ids decoded together end where their text ends
        return True

    def _has_stop(self, checked: int) -> bool:
        """Whether a stop string ends in the text added after ``checked`` characters."""
        tail = self.text[max(0, checked - self._holdback):]
        return any(stop in tail for stop in self._stops)

    def _send(self, text: str) -> tuple[str, list[int], list[float]]:
        delta = text[len(self.sent_text):]
        self.sent_text = text
        start = self.sent_ids
        # the ids whose decoded text fits in what has been sent (_ends never decreases)
        self.sent_ids = max(start, bisect.bisect_right(self._ends, len(text)))
        return delta, self.ids[start:self.sent_ids], self.logprobs[start:self.sent_ids]
