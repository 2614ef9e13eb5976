"""/v1/completions and /v1/chat/completions: a request body becomes engine requests (one per prompt x n), their
rollouts become an OpenAI response, or a stream of server-sent events as their tokens arrive."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from tandemrl.serve.engine_loop import Event, Failed, Finished, TokenDelta
from tandemrl.serve.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, error_body
from tandemrl.serve.state import BadRequest, ServerState
from tandemrl.serve.stream_text import ChoiceText
from tandemrl.types import Request, RequestStats, Rollout


@dataclasses.dataclass
class Job:
    """One request body, ready for the engine: its requests (index = choice index) and how to answer."""

    response_id: str
    chat: bool
    body: CompletionRequest | ChatCompletionRequest
    prompts: list[list[int]]  # per engine request
    requests: list[Request]
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def want_logprobs(self) -> bool:
        return bool(self.body.logprobs) if self.chat else self.body.logprobs is not None


def completion_job(state: ServerState, body: CompletionRequest) -> Job:
    state.check_model(body.model)
    _refuse_unsupported(body)
    prompts = [p if isinstance(p, list) else _encode(state, p) for p in body.prompts()]
    return _job(state, body, prompts, chat=False, max_tokens=body.max_tokens if body.max_tokens is not None else 16)


def chat_job(state: ServerState, body: ChatCompletionRequest) -> Job:
    state.check_model(body.model)
    _refuse_unsupported(body)
    messages = [{"role": m.role, "content": _message_text(m, f"messages.[{i}].content")}
                for i, m in enumerate(body.messages)]
    if getattr(state.tokenizer, "chat_template", None) is None:
        raise BadRequest(f"model {state.model_name!r} has no chat template; use /v1/completions", param="messages")
    ids = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return _job(state, body, [list(ids)], chat=True, max_tokens=body.requested_max_tokens())


def _message_text(message: ChatMessage, param: str) -> str:
    try:
        return message.text()
    except ValueError as exc:
        raise BadRequest(str(exc), param=param, code="unsupported_value") from None


def _refuse_unsupported(body: CompletionRequest | ChatCompletionRequest) -> None:
    refusal = body.unsupported()
    if refusal is not None:
        raise BadRequest(refusal.message, param=refusal.param, code=refusal.code)
    try:
        body.stop_strings()
    except ValueError as exc:
        raise BadRequest(str(exc), param="stop") from None


def _encode(state: ServerState, text: str) -> list[int]:
    return list(state.tokenizer(text, add_special_tokens=False)["input_ids"])


def _job(state: ServerState, body: Any, prompts: list[list[int]], chat: bool, max_tokens: int | None) -> Job:
    response_id = state.response_id("chatcmpl" if chat else "cmpl")
    per_request, requests = [], []
    for ids in prompts:
        params = body.sampling_params(state.check_prompt(ids, max_tokens, "messages" if chat else "prompt"))
        for _ in range(body.n):
            per_request.append(ids)
            requests.append(Request(f"{response_id}-{len(requests)}", ids, params))
    return Job(response_id, chat, body, per_request, requests)


# ---------------------------------------------------------------------------------------------- non-streaming

async def respond(state: ServerState, job: Job, is_disconnected: Callable[[], Awaitable[bool]],
                  arrived: Callable[[], None] | None = None) -> dict | None:
    """The whole response, or None if the client went away first (its sequences are aborted). ``arrived``: see
    ServerState.run."""
    rollouts: dict[str, Rollout] = {}
    last: dict[str, int] = {}
    async for events in state.run(job.requests, is_disconnected, stream=False, arrived=arrived):
        for event in events:
            if isinstance(event, Failed):
                raise RuntimeError(event.message)
            if isinstance(event, Finished):
                rollouts[event.rollout.request_id] = event.rollout
                last[event.rollout.request_id] = event.policy_version_last
    if len(rollouts) < len(job.requests):
        return None
    ordered = [rollouts[r.request_id] for r in job.requests]
    errors = [r.error for r in ordered if r.finish_reason == "error"]
    if errors:
        raise BadRequest(errors[0])
    choices = [_choice(state, job, i, r, last[r.request_id]) for i, r in enumerate(ordered)]
    usage = _usage(job, [len(r.completion_ids) for r in ordered])
    return {"id": job.response_id, "object": job.object_name, "created": job.created, "model": state.model_name,
            "choices": choices, "usage": usage, "policy_version": min(r.policy_version for r in ordered),
            **_prompt_ids(job)}


def _choice(state: ServerState, job: Job, index: int, rollout: Rollout, version_last: int) -> dict:
    """``policy_version``: the weights that sampled its first token; ``policy_version_last``: the server's when it
    finished (they differ when a push landed while it ran; ``version_runs`` then says from which token on)."""
    finish = "length" if rollout.finish_reason == "length" else "stop"
    choice: dict[str, Any] = {"index": index, "finish_reason": finish, "policy_version": rollout.policy_version,
                              "policy_version_last": version_last}
    if rollout.version_runs:  # a push landed while it ran: [[first token index, version], ...]
        choice["version_runs"] = [list(run) for run in rollout.version_runs]
    logprobs = _logprobs(state, job, rollout.completion_ids, rollout.logprobs) if job.want_logprobs else None
    if job.chat:
        choice["message"] = {"role": "assistant", "content": rollout.text}
    else:
        choice["text"] = rollout.text
    choice["logprobs"] = logprobs
    if job.body.return_token_ids:
        choice["token_ids"] = list(rollout.completion_ids)
    choice["stats"] = _stats(rollout.stats)
    return choice


def _stats(stats: RequestStats) -> dict:
    """The request's engine stats, times relative to its arrival (the server's clock is not the client's)."""
    return {"queue_time": stats.queue_time, "time_to_first_token": stats.time_to_first_token,
            "latency": stats.latency, "prompt_tokens": stats.prompt_tokens,
            "cached_prompt_tokens": stats.cached_prompt_tokens, "peak_kv_blocks": stats.peak_kv_blocks,
            "kv_block_bytes": stats.kv_block_bytes, "preemptions": stats.preemptions}


def _logprobs(state: ServerState, job: Job, ids: list[int], lps: list[float]) -> dict:
    tokens = [state.tokenizer.decode([t]) for t in ids]
    if job.chat:
        return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                            for tok, lp in zip(tokens, lps)]}
    offsets, pos = [], 0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps)],
            "text_offset": offsets}


def _usage(job: Job, completion_tokens: list[int]) -> dict:
    prompt_tokens = sum(len(p) for p in job.prompts[::job.body.n])
    return {"prompt_tokens": prompt_tokens, "completion_tokens": sum(completion_tokens),
            "total_tokens": prompt_tokens + sum(completion_tokens)}


def _prompt_ids(job: Job) -> dict:
    if not job.body.return_token_ids:
        return {}
    return {"prompt_token_ids": job.prompts[0] if len(job.prompts) == job.body.n else job.prompts[::job.body.n]}


# ---------------------------------------------------------------------------------------------- streaming

async def stream(state: ServerState, job: Job, arrived: Callable[[], None] | None = None) -> AsyncIterator[str]:
    """Server-sent events: per choice, one chunk per batch of events that added text (every step's tokens since the
    last chunk: one step's when the client keeps up, several when it fell behind), a final chunk with its finish
    reason, then ``data: [DONE]``. Each batch's chunks go out in one write, the last with the usage and [DONE]: every
    write hands the GIL to the engine thread and waits to get it back. A client that disconnects cancels this
    generator, and with it its sequences (state.run aborts them). ``arrived``: see ServerState.run."""
    index = {r.request_id: i for i, r in enumerate(job.requests)}
    texts = [ChoiceText(state.decode, r.params.stop) for r in job.requests]
    if job.chat:
        yield "".join(_sse(_chunk(state, job, i, {"role": "assistant", "content": ""}, None, state.policy_version))
                      for i in range(len(job.requests)))
    lengths: dict[int, int] = {}  # completion tokens of each finished choice
    versions = [state.policy_version] * len(job.requests)
    frames: list[str] = []
    async for events in state.run(job.requests, arrived=arrived):
        for i, event in _merged(events, index):
            error = _stream_error(event)
            if error is not None:
                yield "".join(frames) + _sse(error)
                return
            frames += _choice_frame(state, job, texts[i], i, event, versions)
            if isinstance(event, Finished):
                lengths[i] = len(event.rollout.completion_ids)
        if frames and len(lengths) < len(job.requests):  # the last batch goes out with the end of the stream
            yield "".join(frames)
            frames = []
    if job.body.stream_options is not None and job.body.stream_options.include_usage:
        frames.append(_sse({"id": job.response_id, "object": _chunk_object(job), "created": job.created,
                            "model": state.model_name, "choices": [],
                            "usage": _usage(job, [lengths.get(i, 0) for i in range(len(job.requests))]),
                            "policy_version": min(versions)}))
    yield "".join(frames) + "data: [DONE]\n\n"


def _stream_error(event: Event) -> dict | None:
    """The error payload that ends a stream: the engine failed, or a request it refused."""
    if isinstance(event, Failed):
        return error_body(event.message, "server_error")
    if isinstance(event, Finished) and event.rollout.finish_reason == "error":
        return error_body(event.rollout.error)
    return None


def _choice_frame(state: ServerState, job: Job, text: ChoiceText, i: int, event: TokenDelta | Finished,
                  versions: list[int]) -> list[str]:
    """Choice ``i``'s chunk for its new tokens, or its final one; [] when there is nothing to send yet."""
    if isinstance(event, TokenDelta):
        delta, ids, lps = text.add(event.token_ids, event.logprobs)
        versions[i], finish = event.policy_version, None
    else:
        rollout = event.rollout
        delta, ids, lps = text.finish(rollout.completion_ids, rollout.logprobs, rollout.text)
        finish = "length" if rollout.finish_reason == "length" else "stop"
        versions[i] = rollout.policy_version
    if not (delta or ids or finish):
        return []
    chunk = _delta_chunk(state, job, i, delta, ids, lps, finish, versions[i])
    if isinstance(event, Finished):
        chunk["choices"][0]["policy_version_last"] = event.policy_version_last
        if event.rollout.version_runs:
            chunk["choices"][0]["version_runs"] = [list(run) for run in event.rollout.version_runs]
    return [_sse(chunk)]


def _merged(events: list[Event], index: dict[str, int]) -> list[tuple[int, Event]]:
    """A batch's events, one per choice: its TokenDeltas joined into one, or its Finished alone (which carries the
    whole completion), or its Failed; in the order the choices first appear."""
    merged: dict[int, Event] = {}
    for event in events:
        request_id = event.rollout.request_id if isinstance(event, Finished) else event.request_id
        i = index[request_id]
        before = merged.get(i)
        if isinstance(event, TokenDelta) and isinstance(before, TokenDelta):
            event = TokenDelta(request_id, before.token_ids + event.token_ids, before.logprobs + event.logprobs,
                               event.policy_version)
        merged[i] = event
    return list(merged.items())


def _delta_chunk(state: ServerState, job: Job, i: int, text: str, ids: list[int], lps: list[float],
                 finish: str | None, version: int) -> dict:
    if job.chat:
        chunk = _chunk(state, job, i, {"content": text}, finish, version)
    else:
        chunk = _chunk(state, job, i, None, finish, version)
        chunk["choices"][0]["text"] = text
    choice = chunk["choices"][0]
    if job.want_logprobs:
        choice["logprobs"] = _logprobs(state, job, ids, lps)
    if job.body.return_token_ids:
        choice["token_ids"] = ids
    return chunk


def _chunk(state: ServerState, job: Job, i: int, delta: dict | None, finish: str | None, version: int) -> dict:
    choice: dict[str, Any] = {"index": i, "finish_reason": finish, "logprobs": None}
    if delta is not None:
        choice["delta"] = delta
    return {"id": job.response_id, "object": _chunk_object(job), "created": job.created, "model": state.model_name,
            "choices": [choice], "policy_version": version}


def _chunk_object(job: Job) -> str:
    return "chat.completion.chunk" if job.chat else "text_completion"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
