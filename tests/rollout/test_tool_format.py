"""Tool-call formats: parsing the model's text and the text that carries results back."""

from __future__ import annotations

from tandemrl.rollout.tool_format import HermesFormat, PlainFormat, ToolCall
from tandemrl.rollout.tools import ToolResult


def test_hermes_parses_every_call_of_a_turn():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>\n'
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call><|im_end|>')
    assert HermesFormat().parse(text) == [ToolCall("calculator", {"expression": "2+2"}),
                                          ToolCall("python", {"code": "print(1)"})]
    assert HermesFormat().parse("The answer is 4.<|im_end|>") == []


def test_hermes_bad_calls_carry_an_error():
    bad_json, not_object, unclosed = HermesFormat().parse(
        '<tool_call>{"name": "calculator", "arguments": {</tool_call><tool_call>[1]</tool_call><tool_call>{"na')
    assert bad_json.error.startswith("the tool call is not valid JSON")
    assert "must be a JSON object" in not_object.error
    assert "not closed" in unclosed.error


def test_hermes_results_follow_qwen_template():
    results = [ToolResult("4"), ToolResult("error: boom", error=True)]
    ended = HermesFormat().result_text(results, turn_ended=True)
    assert ended == ("\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\nerror: boom\n"
                     "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert HermesFormat().result_text(results, turn_ended=False).startswith("<|im_end|>\n<|im_start|>user")


def test_plain_format():
    fmt = PlainFormat()
    assert fmt.stop == ("</call>",)
    assert fmt.parse('x <call>calculator {"expression": "1+2"}</call>') == [ToolCall("calculator",
                                                                                       {"expression": "1+2"})]
    assert fmt.parse("<call>python print(3)</call>") == [ToolCall("python", "print(3)")]
    assert fmt.parse("no call here") == []
    assert "not closed" in fmt.parse("<call>python print(").pop().error
    assert "not valid JSON" in fmt.parse("<call>calculator {oops}</call>").pop().error
    assert fmt.parse("<call></call>")[0].error == "the call names no tool"
    assert fmt.result_text([ToolResult("3")], turn_ended=False) == "<result>3</result>\n"


def test_plain_one_token_trigger():
    fmt = PlainFormat(call_open="?", call_close="", result_open="=", result_close=";", default_tool="peek")
    assert fmt.stop == ("?",)
    assert fmt.parse("ab?") == [ToolCall("peek")]
    assert fmt.parse("ab") == []
