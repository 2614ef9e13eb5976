"""How tool calls look in the model's text, and the text that carries tool results back into its context.

- ``HermesFormat``: Qwen2.5/Qwen3 and Hermes instruct models. A turn holds any number of
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks and ends with the chat template's end of turn;
  results come back as a user turn of ``<tool_response>`` blocks, as Qwen's chat template renders tool messages, and
  a new assistant turn is opened. Tools are described to the model through the chat template (``tools=``).
- ``PlainFormat``: base models. A call is ``{call_open}name arguments{call_close}``; the turn stops at
  ``call_close`` (a stop string). Arguments are a JSON object or raw text (bound to a tool's only parameter).
  An empty body calls ``default_tool``; with an empty ``call_close`` the opener alone is a call (a one-token trigger
  that a tiny model can learn).

Only the new text is tokenised: the turn's own tokens are never decoded and encoded again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from tandemrl.rollout.tools import ToolResult


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote; ``error`` says why it cannot run (the model is told, the rollout goes on)."""

    name: str
    arguments: Any = None  # a JSON value, raw text, or None
    error: str | None = None


class ToolFormat(Protocol):
    stop: tuple[str, ...]  # stop strings that end a turn making a call

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in one turn's text (none: the turn is a final answer)."""
        ...

    def result_text(self, results: Sequence[ToolResult], turn_ended: bool) -> str:
        """The text inserted after a turn with calls; ``turn_ended``: the turn's last token closed it (EOS)."""
        ...


_HERMES_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class HermesFormat:
    end_of_turn: str = "<|im_end|>"
    start_of_turn: str = "<|im_start|>"
    stop: tuple[str, ...] = ()

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for match in _HERMES_CALL.finditer(text):
            body, closed = match.group(1).strip(), bool(match.group(2))
            if not closed:
                calls.append(ToolCall("", error="the <tool_call> block was not closed with </tool_call>"))
                continue
            calls.append(_json_call(body))
        return calls

    def result_text(self, results: Sequence[ToolResult], turn_ended: bool) -> str:
        close = "\n" if turn_ended else f"{self.end_of_turn}\n"
        blocks = "".join(f"\n<tool_response>\n{r.text}\n</tool_response>" for r in results)
        return (f"{close}{self.start_of_turn}user{blocks}{self.end_of_turn}\n"
                f"{self.start_of_turn}assistant\n")


def _json_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return ToolCall(call["name"], arguments)


_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class PlainFormat:
    call_open: str = "<call>"
    call_close: str = "</call>"
    result_open: str = "<result>"
    result_close: str = "</result>\n"
    default_tool: str | None = None

    def __post_init__(self) -> None:
        if not self.call_open:
            raise ValueError("tools.call_open must not be empty: it marks where a call starts")

    @property
    def stop(self) -> tuple[str, ...]:
        return (self.call_close or self.call_open,)

    def parse(self, text: str) -> list[ToolCall]:
        start = text.find(self.call_open)
        if start < 0:
            return []
        body = text[start + len(self.call_open):]
        if self.call_close:
            end = body.find(self.call_close)
            if end < 0:
                return [ToolCall("", error=f"the call was not closed with {self.call_close!r}")]
            body = body[:end]
        else:
            body = ""
        return [self._parse_body(body.strip())]

    def _parse_body(self, body: str) -> ToolCall:
        if not body:
            if self.default_tool is None:
                return ToolCall("", error="the call names no tool")
            return ToolCall(self.default_tool)
        match = _NAME.match(body)
        if match is None:
            return ToolCall("", error=f"a call starts with a tool name, got {body[:40]!r}")
        rest = body[match.end():].strip()
        if rest.startswith("{"):
            try:
                return ToolCall(match.group(1), json.loads(rest))
            except json.JSONDecodeError as exc:
                return ToolCall(match.group(1), error=f"the arguments are not valid JSON ({exc.msg})")
        return ToolCall(match.group(1), rest or None)

    def result_text(self, results: Sequence[ToolResult], turn_ended: bool) -> str:
        return "".join(f"{self.result_open}{r.text}{self.result_close}" for r in results)
