"""The trajectory state machine on its own (no engine): token bookkeeping, loss weights, limits, tool errors."""

from __future__ import annotations

from tandemrl.rollout.tool_format import PlainFormat
from tandemrl.rollout.tools import ToolRegistry, ToolResult, make_tool
from tandemrl.rollout.trajectory import AgentLimits, Phase, TrajectorySpec, TrajectoryState, run_calls
from tandemrl.types import RequestStats, Rollout, SamplingParams

FMT = PlainFormat()


def encode(text: str) -> list[int]:
    return [100 + ord(c) for c in text]  # any fixed map will do: the state machine only appends what it gets


def turn(ids: list[int], text: str, prompt_tokens: int = 0, cached: int = 0) -> Rollout:
    stats = RequestStats(prompt_tokens=prompt_tokens, cached_prompt_tokens=cached, generated_tokens=len(ids))
    return Rollout("r", [], ids, [-0.5] * len(ids), "stop", text=text, stats=stats)


def state(limits: AgentLimits = AgentLimits()) -> TrajectoryState:
    spec = TrajectorySpec("t0", [1, 2, 3], SamplingParams(max_tokens=10, stop=("END",)))
    return TrajectoryState(spec, FMT, limits)


def test_tokens_are_concatenated_with_weights():
    s = state()
    request = s.next_request()
    assert request.prompt_ids == [1, 2, 3] and request.params.stop == ("END", "</call>")
    s.on_turn(turn([7, 8], "<call>calculator 1+1</call>"), "<call>calculator 1+1</call>", ended_by_eos=False)
    assert s.phase is Phase.CALLING_TOOL and s.pending_calls[0].name == "calculator"
    s.on_results([ToolResult("2")], encode)
    inserted = encode("<result>2</result>\n")
    assert s.phase is Phase.GENERATING
    assert s.next_request().prompt_ids == [1, 2, 3, 7, 8] + inserted
    history = 3 + 2 + len(inserted)
    s.on_turn(turn([9], "2", prompt_tokens=history, cached=4), "2", ended_by_eos=True)
    assert s.done and s.finish_reason == "stop"
    out = s.result(lambda ids: "|".join(map(str, ids)))
    assert out.rollout.completion_ids == [7, 8] + inserted + [9]
    assert out.rollout.loss_weights == [1.0, 1.0] + [0.0] * len(inserted) + [1.0]
    assert out.rollout.logprobs == [-0.5, -0.5] + [0.0] * len(inserted) + [-0.5]
    assert out.final_text == "2" and out.turns == 2 and out.inserted_tokens == len(inserted)
    assert out.reprefill_tokens == history - 4 - len(inserted)  # history tokens the cache did not serve
    assert [c.result for c in out.tool_calls] == ["2"]


def test_tool_errors_reach_the_model_and_the_rollout_continues():
    s = state()
    s.on_turn(turn([7], "x"), '<call>calculator {"expression": </call>', ended_by_eos=False)
    results = run_calls(s.pending_calls, ToolRegistry([]).call, s.spec.context)
    assert results[0].error and "not valid JSON" in results[0].text
    s.on_results(results, encode)
    assert s.phase is Phase.GENERATING and s.records[0].error
    s.on_turn(turn([8], "x"), "<call>nope</call>", ended_by_eos=False)
    results = run_calls(s.pending_calls, ToolRegistry([make_tool(len_of)]).call, s.spec.context)
    assert results == [ToolResult("error: unknown tool 'nope'; available tools: len_of", error=True)]
    s.on_results(results, encode)
    assert s.phase is Phase.GENERATING and len(s.records) == 2


def len_of(text: str) -> int:
    """Length of a text."""
    return len(text)


def test_limits():
    call = "<call>len_of abc</call>"
    s = state(AgentLimits(max_tool_calls=1))
    s.on_turn(turn([7], call), call, False)
    s.on_results([ToolResult("3")], encode)
    s.on_turn(turn([7], call), call, False)
    assert s.done and s.finish_reason == "max_tool_calls" and len(s.records) == 1

    s = state(AgentLimits(max_turns=1))
    s.on_turn(turn([7], call), call, False)
    assert s.done and s.finish_reason == "max_turns"

    s = state(AgentLimits(max_total_tokens=12))
    assert s.next_request().params.max_tokens == 10
    s.on_turn(turn([7] * 4, call), call, False)
    s.on_results([ToolResult("a long result")], encode)  # 4 + 31 inserted tokens do not fit in 12
    assert s.done and s.finish_reason == "max_total_tokens" and len(s.completion_ids) == 4

    s = state(AgentLimits(max_total_tokens=15))
    s.on_turn(turn([7] * 4, call), call, False)
    s.on_results([ToolResult("")], encode)  # "<result></result>\n": 18 tokens do not fit either
    assert s.finish_reason == "max_total_tokens"


def test_engine_error_ends_the_trajectory():
    s = state()
    failed = Rollout("r", [], [], [], "error", error="prompt too long")
    s.on_turn(failed, "", False)
    assert s.done and s.finish_reason == "error" and s.result(str).rollout.error == "prompt too long"


def test_hermes_turn_with_the_real_tokenizer():
    """A Qwen-style turn: the call is parsed, the calculator runs, and the result comes back as a user turn whose
    special tokens are single ids, all with loss weight 0."""
    from tandemrl.models.tokenizer import build_char_tokenizer
    from tandemrl.rollout.catalog import calculator
    from tandemrl.rollout.tool_format import HermesFormat

    tok = build_char_tokenizer()
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call><|im_end|>'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    spec = TrajectorySpec("h", tok("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")["input_ids"],
                          SamplingParams(max_tokens=100))
    s = TrajectoryState(spec, HermesFormat(), AgentLimits())
    s.on_turn(turn(ids, ""), tok.decode(ids, skip_special_tokens=False), ended_by_eos=True)
    s.on_results(run_calls(s.pending_calls, ToolRegistry([make_tool(calculator)]).call, s.spec.context),
                 lambda t: tok(t, add_special_tokens=False)["input_ids"])
    inserted = s.completion_ids[len(ids):]
    assert tok.decode(inserted, skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert inserted.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2
    assert s.loss_weights == [1.0] * len(ids) + [0.0] * len(inserted)


def test_each_turn_keeps_the_versions_that_sampled_it():
    """Weights pushed between two turns (and within the second): every token carries its own turn's versions, the
    tool output its calling turn's, and the trajectory is as old as its first token."""
    s = state()
    call = "<call>len_of abc</call>"
    s.on_turn(Rollout("r", [], [7, 8], [-0.5] * 2, "stop", policy_version=3), call, False)
    s.on_results([ToolResult("3")], encode)
    inserted = len(encode("<result>3</result>\n"))
    second = Rollout("r", [], [9, 10, 11], [-0.5] * 3, "stop", policy_version=4, version_runs=[(0, 4), (2, 5)])
    s.on_turn(second, "3", True)
    out = s.result(str).rollout
    assert out.token_versions() == [3] * (2 + inserted) + [4, 4, 5]
    assert out.policy_version == 3 and out.version_runs == [(0, 3), (2 + inserted, 4), (4 + inserted, 5)]


def test_one_version_throughout_leaves_no_runs():
    s = state()
    s.on_turn(Rollout("r", [], [7], [-0.5], "stop", policy_version=6), "x", True)
    out = s.result(str).rollout
    assert out.policy_version == 6 and out.version_runs == [] and out.token_versions() == [6]
