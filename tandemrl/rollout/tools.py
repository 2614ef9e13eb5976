"""Tools: plain Python callables, their arguments' JSON schema from type hints, and calls that never raise.

A tool's arguments are checked with a pydantic model built from its signature, so wrong types become a message the
model can read. A parameter annotated ``ToolContext`` is not part of the schema: the agent loop fills it with the
trajectory's own data (e.g. the task sample's hidden columns).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

MAX_ERROR_CHARS = 300


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

    @property
    def schema(self) -> dict[str, Any]:
        """JSON schema of the arguments (OpenAI "parameters" style)."""
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def describe(self) -> dict[str, Any]:
        """The tool as chat templates take it (``tools=[...]``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.schema}}


def make_tool(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> Tool:
    """A Tool from a typed callable; every parameter needs a type hint (its schema comes from it)."""
    name = name or fn.__name__
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    context_parameter = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"tool {name!r}: *args/**kwargs have no schema; name every parameter")
        if param.name not in hints:
            raise ValueError(f"tool {name!r}: parameter {param.name!r} needs a type hint")
        if hints[param.name] is ToolContext:
            context_parameter = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    doc = description or inspect.getdoc(fn) or ""
    return Tool(name, fn, doc.strip().split("\n\n")[0], model, context_parameter)


class ToolRegistry:
    """Tools by name; ``call`` turns every failure (unknown tool, bad arguments, an exception) into a ToolResult."""

    def __init__(self, tools: list[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool

    def describe(self) -> list[dict[str, Any]]:
        return [t.describe() for t in self.tools.values()]

    def call(self, name: str, arguments: Any, context: ToolContext | None = None) -> ToolResult:
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
        except Exception as exc:  # the model sees the failure; the rollout goes on
            return ToolResult(f"error: {name} raised {type(exc).__name__}: {_short(str(exc))}", error=True)
        if isinstance(result, ToolResult):
            return result
        return ToolResult(result if isinstance(result, str) else json.dumps(result, default=str))


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
