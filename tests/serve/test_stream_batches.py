"""The stream's framing: the events that arrived together (several engine steps' tokens when the reader fell behind)
go out as one chunk per choice in one write, and the last one with [DONE]."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")

from tandemrl.config import validate_config  # noqa: E402
from tandemrl.models.tokenizer import build_char_tokenizer  # noqa: E402
from tandemrl.serve.completions import completion_job, stream  # noqa: E402
from tandemrl.serve.engine_loop import Finished, TokenDelta  # noqa: E402
from tandemrl.serve.protocol import CompletionRequest  # noqa: E402
from tandemrl.serve.server import build_state  # noqa: E402
from tandemrl.serve.state import ServerState  # noqa: E402
from tandemrl.types import Request, Rollout, SamplingParams  # noqa: E402
from tests.serve.conftest import MODEL_NAME, serve_config  # noqa: E402


class HeldLoop:
    """An engine loop that only records what it is given: the test hands the events over itself."""

    policy_version = 0

    def __init__(self) -> None:
        self.submitted: list = []

    def submit(self, requests, sink, stream: bool = True) -> None:
        self.submitted.append((requests, sink))

    def abort(self, request_ids) -> None:
        pass


def frames(write: str) -> list[str]:
    return [part for part in write.split("\n\n") if part]


@pytest.mark.parametrize("n", [1, 2])
def test_events_that_arrived_together_go_out_in_one_write(n):
    tokenizer = build_char_tokenizer()
    ids = tokenizer("12+34=46", add_special_tokens=False)["input_ids"]
    loop = HeldLoop()
    state = ServerState(loop=loop, tokenizer=tokenizer, model_name="m", max_model_len=64, vocab_size=len(tokenizer))
    job = completion_job(state, CompletionRequest(model="m", prompt=[1, 2], max_tokens=len(ids), n=n, stream=True,
                                                  return_token_ids=True))

    async def run() -> list[str]:
        writes: list[str] = []
        reader = asyncio.ensure_future(_collect(stream(state, job), writes))
        await asyncio.sleep(0)
        requests, sink = loop.submitted[0]
        names = [r.request_id for r in requests]
        sink.deliver([TokenDelta(name, ids[:3], [-1.0] * 3, 0) for name in names]
                     + [TokenDelta(name, ids[3:5], [-1.0] * 2, 0) for name in names])  # two steps at once
        await asyncio.sleep(0)
        sink.deliver([Finished(Rollout(name, [1, 2], ids, [-1.0] * len(ids), "length", text="12+34=46"), 0)
                      for name in names])
        await reader
        return writes

    writes = asyncio.run(run())
    assert len(writes) == 2  # one per batch of events
    first = [json.loads(f.removeprefix("data: ")) for f in frames(writes[0])]
    assert [c["choices"][0]["token_ids"] for c in first] == [ids[:5]] * n  # both steps' tokens in one chunk each
    last = frames(writes[1])
    assert last[-1] == "data: [DONE]" and len(last) == n + 1
    ends = [json.loads(f.removeprefix("data: "))["choices"][0] for f in last[:-1]]
    assert [(c["token_ids"], c["text"], c["finish_reason"]) for c in ends] == [(ids[5:], "=46", "length")] * n


async def _collect(chunks, writes: list[str]) -> None:
    async for write in chunks:
        writes.append(write)


def test_greedy_streams_are_the_in_process_engines_tokens(server, tiny_dir):
    """Several streams at once (their tokens arrive in batches, several steps' worth per chunk when a reader falls
    behind) add up to the very tokens the same engine gives in-process."""
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    engine = build_state(validate_config(serve_config(tiny_dir)), MODEL_NAME).loop.engine  # never started: ours
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = [r.completion_ids for r in engine.generate([Request(f"r{i}", p, params) for i, p in
                                                           enumerate(prompts)])]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def streamed(prompt: list[int]) -> list[int]:
        chunks = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True, "return_token_ids": True})
        return [t for c in chunks for t in c.choices[0].model_extra.get("token_ids", [])]

    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(streamed, prompts)) == expected
