"""The built-in tools, by name (``tools.names``).

- ``python``: model-written code in the sandbox (sandbox.py); returns what it prints.
- ``calculator``: one arithmetic expression (+ - * / // % **, parentheses, numbers), evaluated from its syntax tree.
- ``peek``: the synthetic tool task's only tool: returns the trajectory's hidden answer (from its sample).

Beside them, ``tools.names`` takes a user's own tools as ``package.module:function`` or ``path/to/file.py:function``
(loaded as reward functions are, tandemrl/user_code.py), and the Python API's callables (``Trainer(tools=[fn])``,
recorded as ``inline:<name>``).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any, Callable

from tandemrl.rollout.sandbox import Sandbox, SandboxLimits, python_tool
from tandemrl.rollout.tools import Tool, ToolContext, make_tool
from tandemrl.user_code import INLINE, did_you_mean, inline_message, is_user_spec, load_callable

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


BUILTIN_TOOLS: dict[str, Callable[[SandboxLimits], Tool]] = {
    "python": lambda limits: make_tool(python_tool(Sandbox(limits)), name="python"),
    "calculator": lambda limits: make_tool(calculator),
    "peek": lambda limits: make_tool(peek),
}


def tool_name_error(name: str) -> str | None:
    """Why ``name`` cannot be a ``tools.names`` entry (None: it can): neither built in nor a user's spec. A spec's
    file is only read when the tools are built, as a reward function's is."""
    if name in BUILTIN_TOOLS or name.startswith(INLINE) or is_user_spec(name):
        return None
    return (f"tools.names: unknown tool {name!r}{did_you_mean(name, BUILTIN_TOOLS)}; built-in tools: "
            f"{', '.join(BUILTIN_TOOLS)}; or your own as 'package.module:function' or 'path/to/file.py:function'")


def build_tools(names: list[str], sandbox_limits: SandboxLimits,
                callables: Mapping[str, Callable[..., Any]] | None = None) -> list[Tool]:
    """Tools by name: built in, a user's spec, or one of ``callables`` (the Python API's, by the name the config
    records); an unknown name is an error naming the valid ones."""
    return [_build_tool(name, sandbox_limits, callables or {}) for name in names]


def _build_tool(name: str, limits: SandboxLimits, callables: Mapping[str, Callable[..., Any]]) -> Tool:
    if name in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[name](limits)
    if name in callables:
        fn = callables[name]
    elif name.startswith(INLINE):
        message = inline_message(name, name[len(INLINE):], "tool", "tools", "tools.names",
                                 "with the run's other tools, if any")
        raise ValueError(f"tools.names: {message}")
    else:
        error = tool_name_error(name)
        if error is not None:
            raise ValueError(error)
        try:
            fn = load_callable(name, "tool")
        except ValueError as err:
            raise ValueError(f"tools.names: {err}") from None
    try:
        return make_tool(fn, source=name)
    except ValueError as err:
        raise ValueError(f"tools.names: {err}") from None
