"""The agent loop over the real engine and the tiny model (CPU, greedy).

The randomly initialised tiny model repeats the last character under greedy decoding, so a prompt ending in the
call opener makes a turn that calls a tool at once; the tool results then steer what comes next.
"""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import Qwen2ForCausalLM

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.models.tiny import tiny_config
from tandemrl.models.tokenizer import build_char_tokenizer
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.rollout.tool_format import PlainFormat
from tandemrl.rollout.tools import ToolContext, ToolRegistry, make_tool
from tandemrl.rollout.trajectory import AgentLimits, TrajectorySpec
from tandemrl.types import SamplingParams

FMT = PlainFormat(call_open="e", call_close="", result_open="[", result_close="", default_tool="echo")


def echo(context: ToolContext) -> str:
    """Returns the trajectory's note."""
    return str(context.columns.get("note", "ok"))


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as training sets it for tiny models: several times faster on a shared 2-core machine
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(vocab_size=len(tokenizer), eos_id=0)).eval()
    yield EngineBackend(model, tokenizer, EngineConfig(num_blocks=512, cuda_graphs=False), device="cpu")
    torch.set_num_threads(threads)


def specs(tokenizer, n: int, prefix: str = "hello", max_tokens: int = 6) -> list[TrajectorySpec]:
    out = []
    for i in range(n):
        ids = tokenizer(f"{prefix} {i} e", add_special_tokens=False)["input_ids"]
        note = "e" if i % 2 else f"k{i}"  # odd: the result ends in the opener, so the model calls again
        out.append(TrajectorySpec(f"t{i}", ids, SamplingParams(max_tokens=max_tokens, temperature=0.0),
                                  ToolContext({"note": note})))
    return out


def recording(loop: AgentLoop):
    """Every request the loop adds and every rollout the engine returns, by request id."""
    requests, outputs = {}, {}
    add, step = loop.engine.add_request, loop.engine.step

    def add_request(request, policy_version=0):
        requests[request.request_id] = request
        return add(request, policy_version)

    def record_step():
        rollouts = step()
        outputs.update({r.request_id: r for r in rollouts})
        return rollouts

    loop.engine.add_request, loop.engine.step = add_request, record_step
    return requests, outputs


def make_loop(backend, tokenizer, limits=AgentLimits(max_turns=4, max_tool_calls=3, max_total_tokens=200), **kw):
    return AgentLoop(backend.engine, tokenizer, FMT, ToolRegistry([make_tool(echo)]), limits, **kw)


def test_final_ids_are_engine_outputs_and_inserted_tokens(backend, tokenizer):
    loop = make_loop(backend, tokenizer)
    requests, outputs = recording(loop)
    try:
        with backend.generating():
            trajectories = loop.run(specs(tokenizer, 6))
    finally:
        del loop.engine.add_request, loop.engine.step
    assert any(len(t.tool_calls) >= 2 for t in trajectories) and all(t.tool_calls for t in trajectories)
    for t in trajectories:
        prompt = t.rollout.prompt_ids
        expected_ids, expected_weights, expected_logprobs = [], [], []
        for k in range(t.turns):
            request, out = requests[f"{t.rollout.request_id}#{k}"], outputs[f"{t.rollout.request_id}#{k}"]
            inserted = request.prompt_ids[len(prompt) + len(expected_ids):]  # what came in since the last turn
            if k:  # exactly the tokenised result text of that turn's calls, nothing re-tokenised before it
                results = [r for r in t.tool_calls][k - 1:k]
                text = "".join(f"[{r.result}" for r in results)
                assert inserted == tokenizer(text, add_special_tokens=False)["input_ids"]
            assert request.prompt_ids[:len(prompt) + len(expected_ids)] == prompt + expected_ids
            expected_ids += inserted + out.completion_ids
            expected_weights += [0.0] * len(inserted) + [1.0] * len(out.completion_ids)
            expected_logprobs += [0.0] * len(inserted) + list(out.logprobs)
        assert t.rollout.completion_ids == expected_ids
        assert t.rollout.loss_weights == expected_weights
        assert t.rollout.logprobs == pytest.approx(expected_logprobs)
        assert t.inserted_tokens == expected_weights.count(0.0)


def test_async_and_turn_synchronous_loops_agree(backend, tokenizer):
    loop = make_loop(backend, tokenizer)
    with backend.generating():
        asynchronous = loop.run(specs(tokenizer, 8))
        synchronous = loop.run_turn_synchronous(specs(tokenizer, 8))
    for a, s in zip(asynchronous, synchronous):
        assert a.rollout.completion_ids == s.rollout.completion_ids
        assert a.rollout.finish_reason == s.rollout.finish_reason
        assert [c.result for c in a.tool_calls] == [c.result for c in s.tool_calls]
    assert {t.rollout.finish_reason for t in asynchronous} >= {"max_tool_calls"}


def test_engine_decodes_others_while_a_tool_waits(backend, tokenizer):
    """Trajectory 0's tool blocks until trajectory 1 finished its SECOND turn, which needs the engine to run while
    the tool waits. The batch-synchronous loop cannot do that (its tool times out): the test can fail."""

    def run(synchronous: bool) -> str:
        second_turn_done = threading.Event()

        def work(context: ToolContext) -> str:
            """Waits for the other trajectory, or returns at once."""
            if context.columns["role"] == "waiter":
                return "saw-it" if second_turn_done.wait(timeout=3.0) else "timeout"
            return "go"

        loop = AgentLoop(backend.engine, tokenizer, PlainFormat("e", "", "[", "]", "work"),
                         ToolRegistry([make_tool(work)]), AgentLimits(max_turns=3, max_tool_calls=1))
        step = loop.engine.step

        def watching_step():
            rollouts = step()
            if any(r.request_id == "t1#1" for r in rollouts):
                second_turn_done.set()
            return rollouts

        loop.engine.step = watching_step
        both = [TrajectorySpec(f"t{i}", tokenizer(f"x{i} e", add_special_tokens=False)["input_ids"],
                               SamplingParams(max_tokens=4, temperature=0.0), ToolContext({"role": role}))
                for i, role in enumerate(["waiter", "runner"])]
        try:
            with backend.generating():
                trajectories = (loop.run_turn_synchronous if synchronous else loop.run)(both)
        finally:
            del loop.engine.step
        return trajectories[0].tool_calls[0].result

    assert run(synchronous=False) == "saw-it"
    assert run(synchronous=True) == "timeout"


def test_resumed_turns_reuse_the_cached_history(backend, tokenizer):
    loop = make_loop(backend, tokenizer, AgentLimits(max_turns=3, max_tool_calls=2, max_total_tokens=300))
    requests, outputs = recording(loop)
    long_prompt = "a fairly long prompt so that the history spans several KV blocks of sixteen tokens"
    try:
        with backend.generating():
            trajectories = loop.run(specs(tokenizer, 4, prefix=long_prompt, max_tokens=20))
    finally:
        del loop.engine.add_request, loop.engine.step
    block = backend.engine.config.block_size
    for t in trajectories:
        assert t.turns >= 2
        recomputed = 0
        for k in range(1, t.turns):
            stats = outputs[f"{t.rollout.request_id}#{k}"].stats
            history = stats.prompt_tokens
            previous_prompt = len(requests[f"{t.rollout.request_id}#{k - 1}"].prompt_ids)
            assert stats.cached_prompt_tokens >= previous_prompt // block * block  # the old history was cached
            recomputed += stats.prompt_tokens - stats.cached_prompt_tokens
            assert history > 2 * block
        assert 0 <= t.reprefill_tokens <= (t.turns - 1) * block  # at most the last partial block per resume
        assert t.reprefill_tokens <= recomputed


def test_agent_needs_the_engine_backend():
    from tandemrl.config import load_config
    from tandemrl.rollout.setup import build_agent

    cfg = load_config(None, ["data.task=synthetic:peek"])
    with pytest.raises(ValueError, match="tools need the engine backend; object has no request-level API"):
        build_agent(cfg, object(), None)
