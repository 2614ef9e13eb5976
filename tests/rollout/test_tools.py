"""Tools: JSON schema from type hints, and every failure (unknown tool, bad arguments, an exception) as a message."""

from __future__ import annotations

import pytest

from tandemrl.rollout.catalog import build_tools, calculator
from tandemrl.rollout.sandbox import SandboxLimits
from tandemrl.rollout.tools import ToolContext, ToolRegistry, make_tool


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Longer text that is not part of the description."""
    return a + b


def secret(context: ToolContext, salt: str = "") -> str:
    """The hidden answer."""
    return salt + str(context.columns["answer"])


def broken(x: float) -> str:
    """Always fails."""
    raise RuntimeError(f"cannot handle {x}")


def registry() -> ToolRegistry:
    return ToolRegistry([make_tool(add), make_tool(secret), make_tool(broken)])


def test_schema_from_type_hints():
    described = {d["function"]["name"]: d["function"] for d in registry().describe()}
    add_fn = described["add"]
    assert add_fn["description"] == "Add two integers."
    assert add_fn["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"default": 2, "type": "integer"}}
    assert add_fn["parameters"]["required"] == ["a"]
    # the context parameter is filled by the loop, not written by the model
    assert set(described["secret"]["parameters"]["properties"]) == {"salt"}


def test_calls_and_context():
    reg = registry()
    assert reg.call("add", {"a": 3, "b": 4}).text == "7"
    assert reg.call("add", {"a": 3}).text == "5"
    result = reg.call("secret", {"salt": "#"}, ToolContext({"answer": 9}))
    assert result.text == "#9" and not result.error


@pytest.mark.parametrize("name, arguments, message", [
    ("nope", {}, "unknown tool 'nope'; available tools: add, secret, broken"),
    ("add", {"a": "three"}, "bad arguments for 'add': a: Input should be a valid integer"),
    ("add", {"b": 1}, "bad arguments for 'add': a: Field required"),
    ("add", {"a": 1, "c": 2}, "bad arguments for 'add': c: Extra inputs are not permitted"),
    ("add", [1, 2], "arguments of 'add' must be a JSON object"),
    ("broken", {"x": 1.5}, "broken raised RuntimeError: cannot handle 1.5"),
])
def test_failures_become_tool_messages(name, arguments, message):
    result = registry().call(name, arguments)
    assert result.error
    assert result.text.startswith("error: ") and message in result.text


def test_untyped_tool_is_rejected():
    def untyped(x):  # noqa: ANN001
        return x

    with pytest.raises(ValueError, match="parameter 'x' needs a type hint"):
        make_tool(untyped)


def test_calculator():
    assert calculator("(12 + 30) * 4 / 3") == "56"
    assert calculator("7 / 2") == "3.5"
    with pytest.raises(ValueError, match="only numbers"):
        calculator("__import__('os').system('ls')")
    with pytest.raises(ValueError, match="exponent"):
        calculator("9 ** 9999999")


def test_unknown_builtin_tool_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown tool 'shell'; built-in tools: python, calculator, peek"):
        build_tools(["shell"], SandboxLimits())


def shout(word: str, times: int) -> str:
    """The word, repeated."""
    return word * times


def test_a_long_result_is_cut_with_a_note():
    capped = ToolRegistry([make_tool(shout), make_tool(broken)], max_result_chars=10)
    assert capped.call("shout", {"word": "ab", "times": 5}).text == "ababababab"
    cut = capped.call("shout", {"word": "ab", "times": 600})
    assert cut.text == "ababababab\n[result truncated: 1,200 characters in all, the first 10 shown]"
    assert not cut.error and capped.call("broken", {"x": 1.0}).error  # an error stays one when cut
    assert len(ToolRegistry([make_tool(shout)]).call("shout", {"word": "ab", "times": 600}).text) == 1200
