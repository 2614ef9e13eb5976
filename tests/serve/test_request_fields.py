"""Nothing a client sends is dropped unseen: OpenAI fields the engine cannot honour (tools, tool_choice,
response_format other than text, tool turns in the messages, ...) and fields nobody defined get a 400 whose OpenAI
error body names the field (``param``) and says why (``code``); the documented hints are accepted."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

from tandemrl.serve.protocol import CHAT_UNSUPPORTED, ChatCompletionRequest  # noqa: E402
from tests.serve.conftest import MODEL_NAME  # noqa: E402

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


def chat(**fields) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2, **fields}


def completion(**fields) -> dict:
    return {"model": MODEL_NAME, "prompt": "1+1=", "max_tokens": 2, **fields}


def refused(server, path: str, body: dict, status: int = 400) -> dict:
    """The error of a refused request, after checking it has OpenAI's shape: exactly these four keys, a string or
    null code (never the HTTP status)."""
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and isinstance(error["message"], str)
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


def test_a_tool_calling_request_is_refused_naming_tools(server):
    """The audit's request: tools, tool_choice "required", an assistant turn with tool_calls and a tool turn."""
    messages = [{"role": "user", "content": "add"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    error = refused(server, "/v1/chat/completions", chat(messages=messages, tools=[TOOL], tool_choice="required"))
    assert error["param"] == "tools" and error["code"] == "unsupported_parameter"
    assert "tools is not supported" in error["message"]


@pytest.mark.parametrize("field, value", [("tool_choice", "required"), ("tool_choice", "none"),
                                          ("parallel_tool_calls", False), ("response_format", {"type": "json_object"}),
                                          ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
                                          ("reasoning_effort", "low"), ("store", True), ("modalities", ["audio"])])
def test_chat_options_the_engine_cannot_honour_are_refused(server, field, value):
    error = refused(server, "/v1/chat/completions", chat(**{field: value}))
    assert error["param"] == field and field in error["message"], error


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "content": None, "tool_calls": [CALL]}, "messages.[1].tool_calls"),
    ({"role": "tool", "tool_call_id": "call_1", "content": "2"}, "messages.[1].role"),
    ({"role": "user", "content": "hi", "name": "bob"}, "messages.[1].name"),
])
def test_message_fields_the_chat_template_is_not_given_are_refused(server, message, param):
    body = chat(messages=[{"role": "user", "content": "1+1="}, message])
    assert refused(server, "/v1/chat/completions", body)["param"] == param


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", completion(min_tokens=2), "min_tokens"),
    ("/v1/completions", completion(tools=[TOOL]), "tools"),  # not a field of the completions API
    ("/v1/chat/completions", chat(skip_special_tokens=False), "skip_special_tokens"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "x", "cache": 1}]), "messages.[0].cache"),
    ("/v1/completions", completion(stream=True, stream_options={"include_obfuscation": True}),
     "stream_options.include_obfuscation"),
])
def test_unknown_fields_are_refused_by_name(server, path, body, param):
    error = refused(server, path, body)
    assert error["param"] == param and error["code"] == "unknown_parameter", error
    assert "unknown parameter" in error["message"] and param.split(".")[-1] in error["message"]


def test_hints_defaults_and_echoed_assistant_turns_are_accepted(server):
    """What changes no output: the caller's labels, options at the value the server does anyway, and an assistant
    message echoed back as the openai client dumps it (its tool_calls, refusal, ... null)."""
    echoed = {"role": "assistant", "content": "2", "tool_calls": None, "refusal": None, "function_call": None,
              "audio": None, "annotations": []}
    body = chat(messages=[{"role": "user", "content": "1+1="}, echoed, {"role": "user", "content": "again"}],
                user="u1", metadata={"run": "a"}, safety_identifier="s", prompt_cache_key="k", store=False,
                response_format={"type": "text"}, modalities=["text"], service_tier="auto", tools=None)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    response = httpx.post(server.url + "/v1/completions", json=completion(user="u1", presence_penalty=0), timeout=60)
    assert response.status_code == 200, response.text


def test_the_error_body_names_the_field_and_a_string_code(server):
    error = refused(server, "/v1/completions", completion(max_tokens="ten"))
    assert error["param"] == "max_tokens" and error["code"] is None
    error = refused(server, "/v1/completions", completion(max_tokens=10**6))
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
    error = refused(server, "/v1/completions", completion(logprobs=5))
    assert error["param"] == "logprobs" and error["code"] == "unsupported_value"
    error = refused(server, "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "hi"}]))
    assert error["param"] == "messages.[0].role"
    error = refused(server, "/v1/completions", {"prompt": "1+1="})
    assert error["param"] == "model" and error["code"] == "missing_required_parameter"
    response = httpx.post(server.url + "/v1/completions", content=b'{"model": ', timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["param"] is None


def test_an_unknown_model_is_404_model_not_found(server):
    for path, body in [("/v1/completions", completion(model="gpt-4")), ("/v1/chat/completions", chat(model="gpt-4"))]:
        error = refused(server, path, body, status=404)
        assert error["code"] == "model_not_found" and error["param"] == "model" and "'gpt-4'" in error["message"]


def test_the_openai_client_sees_param_and_code(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refusal:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                       tool_choice="required", max_tokens=2)
    assert refusal.value.param == "tools" and refusal.value.code == "unsupported_parameter"
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert missing.value.code == "model_not_found" and missing.value.type == "invalid_request_error"


@pytest.mark.parametrize("field", CHAT_UNSUPPORTED)
def test_every_unsupported_chat_field_is_refused_when_sent(field):
    body = ChatCompletionRequest.model_validate(chat(**{field: {"x": 1}}))
    refusal = body.unsupported()
    assert refusal is not None and refusal.param == field
    assert ChatCompletionRequest.model_validate(chat(**{field: None})).unsupported() is None  # null: not sent
