"""The built-in tools, by name (``tools.names``), and the tool setup each task starts from.

- ``python``: model-written code in the sandbox (sandbox.py); returns what it prints.
- ``calculator``: one arithmetic expression (+ - * / // % **, parentheses, numbers), evaluated from its syntax tree.
- ``peek``: the synthetic tool task's only tool: returns the trajectory's hidden answer (from its sample).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from tandemrl.rollout.sandbox import Sandbox, SandboxLimits, python_tool
from tandemrl.rollout.tools import Tool, ToolContext, make_tool

_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 100


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "(12 + 30) * 4 / 3"."""
    tree = ast.parse(expression.strip(), mode="eval")
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / // % ** are allowed, got {ast.unparse(node)!r}")


def peek(context: ToolContext) -> str:
    """Reveal the hidden value of this question."""
    if "answer" not in context.columns:
        raise ValueError("this question has no hidden value")
    return str(context.columns["answer"])


BUILTIN_TOOLS = ("python", "calculator", "peek")


def build_tools(names: list[str], sandbox_limits: SandboxLimits) -> list[Tool]:
    """Tools by name; an unknown name is an error naming the valid ones."""
    tools = []
    for name in names:
        if name == "python":
            tools.append(make_tool(python_tool(Sandbox(sandbox_limits)), name="python"))
        elif name == "calculator":
            tools.append(make_tool(calculator))
        elif name == "peek":
            tools.append(make_tool(peek))
        else:
            raise ValueError(f"tools.names: unknown tool {name!r}; built-in tools: {', '.join(BUILTIN_TOOLS)}")
    return tools


@dataclass(frozen=True)
class TaskTools:
    """The tool setup a task starts from (the tools section's keys override it)."""

    names: list[str] = field(default_factory=list)
    format: str = "hermes"
    plain: dict[str, str] = field(default_factory=dict)  # PlainFormat fields
    max_tool_calls: int = 8


# synthetic:peek: the call is one token ("?"), which a tiny model finds by chance and GRPO reinforces; the result
# ("=7") ends right where the answer starts; one call is all the task needs (a second one ends the trajectory).
TASK_TOOLS: dict[str, TaskTools] = {
    "synthetic:peek": TaskTools(["peek"], "plain", {"call_open": "?", "call_close": "", "result_open": "=",
                                                     "result_close": "", "default_tool": "peek"}, max_tool_calls=1),
}
