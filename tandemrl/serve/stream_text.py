"""Turn one choice's growing token list into text deltas that never have to be taken back.

A stop string may start in text already decoded, so the last ``len(longest stop) - 1`` characters are held back
until more text shows they do not begin one; a trailing U+FFFD (half of a multi-byte character) waits for the
next token. Token ids and log-probs go out with the text they produced, so a client that concatenates the
chunks gets exactly the final completion, cut at the stop string.
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


class ChoiceText:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: tuple[str, ...]) -> None:
        self._decode = decode
        self._holdback = max((len(s) for s in stops), default=1) - 1
        self._stops = stops
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.sent_text = ""
        self.sent_ids = 0  # leading ids whose text has been sent

    def add(self, ids: list[int], logprobs: list[float]) -> tuple[str, list[int], list[float]]:
        """Tokens arrived; returns (text, ids, log-probs) safe to send now."""
        self.ids += ids
        self.logprobs += logprobs
        text = self._decode(self.ids)
        if any(stop in text for stop in self._stops):
            return "", [], []  # the engine finishes this choice; finish() sends the cut text
        safe = len(text) - self._holdback
        while safe > len(self.sent_text) and text[safe - 1] == REPLACEMENT:
            safe -= 1
        return self._send(text[:safe] if safe > len(self.sent_text) else self.sent_text)

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

    def _send(self, text: str) -> tuple[str, list[int], list[float]]:
        delta = text[len(self.sent_text):]
        self.sent_text = text
        start = self.sent_ids
        # the ids whose decoded text fits in what has been sent
        while self.sent_ids < len(self.ids) and len(self._decode(self.ids[:self.sent_ids + 1])) <= len(text):
            self.sent_ids += 1
        return delta, self.ids[start:self.sent_ids], self.logprobs[start:self.sent_ids]
