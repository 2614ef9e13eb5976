"""Tools: plain Python callables, their arguments' JSON schema from type hints, and calls that never raise.

A tool's arguments are checked with a pydantic model built from its signature, so wrong types become a message the
model can read. A parameter annotated ``ToolContext`` is not part of the schema: the agent loop fills it with the
trajectory's own data (e.g. the task sample's hidden columns).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

MAX_ERROR_CHARS = 300
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the trajectory that calls it (not written by the model)."""

    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer as the model will read it; ``error`` marks failed calls (counted in ``tools/errors``)."""

    text: str
    error: bool = False


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    arguments: type[BaseModel]  # validates the model's arguments
    context_parameter: str | None  # the parameter that receives the ToolContext, if any
    source: str | None = None  # a user's tool: its spec (``file.py:fn``); its failures' first traceback is logged
    parameter_docs: dict[str, str] = field(default_factory=dict)  # parameter -> description (the docstring's Args)

    @property
    def schema(self) -> dict[str, Any]:
        """JSON schema of the arguments (OpenAI "parameters" style)."""
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        for key, prop in schema.get("properties", {}).items():
            prop.pop("title", None)
            if key in self.parameter_docs:
                prop["description"] = self.parameter_docs[key]
        return schema

    def describe(self) -> dict[str, Any]:
        """The tool as chat templates take it (``tools=[...]``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.schema}}


def make_tool(fn: Callable[..., Any], name: str | None = None, description: str | None = None,
              source: str | None = None) -> Tool:
    """A Tool from a typed callable; every parameter needs a type hint (its schema comes from it). ``source``: a
    user's tool (its spec), which also needs a docstring: its first paragraph is what the model reads, and a
    Google-style ``Args:`` section describes the parameters (as transformers' ``get_json_schema`` reads it)."""
    name = name or fn.__name__
    label = f"tool {name!r}" + (f" ({source})" if source and source != name else "")
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    context_parameter = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"{label}: *args/**kwargs have no schema; name every parameter")
        if param.name not in hints:
            raise ValueError(f"{label}: parameter {param.name!r} needs a type hint (the model's arguments are "
                             f"checked against it), e.g. `{param.name}: str`")
        if hints[param.name] is ToolContext:
            context_parameter = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    doc = description or inspect.getdoc(fn) or ""
    if source is not None and not doc.strip():
        raise ValueError(f"{label} needs a docstring: its first line is the description the model reads "
                         "(add an 'Args:' section to describe the parameters)")
    summary, parameter_docs = _docstring_parts(fn) if source is not None else ("", {})
    return Tool(name, fn, description or summary or doc.strip().split("\n\n")[0], model, context_parameter, source,
                parameter_docs)


def _docstring_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(description, parameter -> description) from a Google-style docstring, parsed as transformers does for
    TRL's tools; ("", {}) where its parser does not take the docstring (the caller falls back to the first
    paragraph)."""
    from transformers.utils import chat_template_utils as templates  # deferred: only user tools need it

    # public from transformers 5, private before; neither: the first paragraph still describes the tool
    parse = getattr(templates, "parse_google_format_docstring", None) or getattr(
        templates, "_parse_google_format_docstring", None)
    if parse is None:
        return "", {}
    description, args, _ = parse(inspect.getdoc(fn) or "")
    return (description or "").strip(), {k: v.strip() for k, v in (args or {}).items()}


class ToolRegistry:
    """Tools by name; ``call`` turns every failure (unknown tool, bad arguments, an exception) into a ToolResult."""

    def __init__(self, tools: list[Tool], max_result_chars: int | None = None) -> None:
        self.tools: dict[str, Tool] = {}
        self.max_result_chars = max_result_chars  # None: results are inserted whole
        self._traceback_logged = threading.Event()  # a user tool's failure: its traceback once, not every call
        for tool in tools:
            if tool.name in self.tools:  # the model calls a tool by its name: one name, one tool
                sources = [t.source or t.name for t in (self.tools[tool.name], tool)]
                raise ValueError(f"two tools are named {tool.name!r} ({' and '.join(sources)}); rename your "
                                 "function")
            self.tools[tool.name] = tool

    def describe(self) -> list[dict[str, Any]]:
        return [t.describe() for t in self.tools.values()]

    def call(self, name: str, arguments: Any, context: ToolContext | None = None) -> ToolResult:
        """The tool's result, its text cut to ``max_result_chars`` (a result over the trajectory's token budget
        would otherwise end it, the result unread)."""
        result = self._call(name, arguments, context)
        limit = self.max_result_chars
        if limit is None or len(result.text) <= limit:
            return result
        note = f"[result truncated: {len(result.text):,} characters in all, the first {limit:,} shown]"
        return ToolResult(f"{result.text[:limit]}\n{note}", result.error)

    def _call(self, name: str, arguments: Any, context: ToolContext | None) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolResult(f"error: unknown tool {name!r}; available tools: {known}", error=True)
        arguments = _bind_raw(tool, arguments)
        if not isinstance(arguments, dict):
            return ToolResult(f"error: arguments of {name!r} must be a JSON object, got {_short(arguments)}", True)
        try:
            checked = tool.arguments.model_validate(arguments)
        except ValidationError as exc:
            return ToolResult(f"error: bad arguments for {name!r}: {_validation_summary(exc)}", error=True)
        kwargs = {key: getattr(checked, key) for key in type(checked).model_fields}
        if tool.context_parameter is not None:
            kwargs[tool.context_parameter] = context or ToolContext()
        try:
            result = tool.fn(**kwargs)
            if inspect.iscoroutine(result):  # an async def tool: its own event loop, in this tool thread
                result = asyncio.run(result)
        except Exception as exc:  # the model sees the failure; the rollout goes on
            if tool.source is not None:
                self._log_first_failure(tool)
            return ToolResult(f"error: {name} raised {type(exc).__name__}: {_short(str(exc))}", error=True)
        if isinstance(result, ToolResult):
            return result
        return ToolResult(result if isinstance(result, str) else json.dumps(result, default=str))


    def _log_first_failure(self, tool: Tool) -> None:
        """The first traceback of a user's tool, so that a bug in it shows (the model only reads one line)."""
        if not self._traceback_logged.is_set():
            self._traceback_logged.set()
            logger.warning("tool %r (%s) raised; the model reads the error and the rollout goes on (later "
                           "failures are counted in tools/errors, not printed):\n%s", tool.name, tool.source,
                           traceback.format_exc())


def _bind_raw(tool: Tool, arguments: Any) -> Any:
    """A raw string for a tool with exactly one argument binds to it (the plain format's ``name raw text``);
    None binds to no argument."""
    if arguments is None:
        return {}
    fields = list(tool.arguments.model_fields)
    if isinstance(arguments, str) and len(fields) == 1:
        return {fields[0]: arguments}
    return arguments


def _validation_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return _short("; ".join(parts))


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."
