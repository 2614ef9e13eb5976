"""The OpenAI request bodies the server accepts (pydantic), and how they map onto the engine's SamplingParams.

Extensions beside OpenAI's fields (vLLM spells them the same): ``top_k``, ``ignore_eos``, ``return_token_ids``
(each choice carries its completion's token ids, the response the prompt's). Nothing is ignored silently: a field
that is not one of these and not OpenAI's is refused (``unknown_parameter``), and so is an OpenAI field the engine
cannot honour (``echo``, ``best_of`` > n, penalties, ``logit_bias``, ``suffix``, more than the sampled token's
log-prob, tools, ``response_format`` other than text, ...) unless it holds its default (``unsupported_parameter``
/ ``unsupported_value``). Accepted and not used: the fields OpenAI documents as labels of the caller or hints that
do not change the output (HINTS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from tandemrl.types import SamplingParams

MAX_N = 128
MAX_INT32 = 2**31 - 1  # token counts and top_k: far above any context, and what the engine's tensors hold
INT64 = 2**63  # a seed is an int64 (torch.Generator's, OpenAI's and vLLM's range)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
# OpenAI fields that label the caller or hint at caching; they change no output, so accepting them unused is safe.
HINTS = ("user", "safety_identifier", "metadata", "prompt_cache_key")


@dataclass(frozen=True)
class Refusal:
    """Why a request cannot be served as asked: the field (OpenAI's ``param``), a message, OpenAI's ``code``."""

    param: str
    message: str
    code: str = "unsupported_parameter"


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error body: ``kind`` is invalid_request_error (the client's fault) or server_error."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def given(value: Any) -> bool:
    """A field counts as sent unless it is absent, null or empty (clients echo ``tool_calls: null`` back)."""
    return value is not None and value != [] and value != {}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # include_obfuscation & co: not done here, so refused

    include_usage: StrictBool = False


class _Body(BaseModel):
    # extra="forbid": a field we do not know would otherwise be dropped unseen (app.py reports it as unknown_parameter)
    # allow_inf_nan: Python's JSON parser reads Infinity, NaN and 1e999; no sampling setting means anything there
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: StrictStr
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_INT32)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=0, le=MAX_INT32)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = Field(None, ge=-INT64, lt=INT64)
    ignore_eos: StrictBool = False
    return_token_ids: StrictBool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # HINTS: accepted, not used
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    prompt_cache_key: StrictStr | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, stop=self.stop_strings(), ignore_eos=self.ignore_eos, seed=self.seed)

    def unsupported(self) -> Refusal | None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return Refusal(name, f"{name} is not supported (leave it 0)", "unsupported_value")
        if self.logit_bias:
            return Refusal("logit_bias", "logit_bias is not supported")
        return None


class CompletionRequest(_Body):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: StrictBool = False
    best_of: StrictInt | None = Field(None, ge=1, le=MAX_N)
    suffix: StrictStr | None = None

    @model_validator(mode="after")
    def _non_empty(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a text or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):  # validated: a list holds one kind (ids, texts or id lists)
            return [list(self.prompt)]  # type: ignore[arg-type]
        return list(self.prompt)  # type: ignore[arg-type]

    def unsupported(self) -> Refusal | None:
        if self.echo:
            return Refusal("echo", "echo is not supported", "unsupported_value")
        if self.best_of is not None and self.best_of != self.n:
            return Refusal("best_of", "best_of other than n is not supported", "unsupported_value")
        if self.suffix:
            return Refusal("suffix", "suffix is not supported")
        if self.logprobs is not None and self.logprobs > 1:
            return Refusal("logprobs", "logprobs > 1 is not supported: the engine returns the log-prob of the sampled "
                                       "token only (ask for logprobs=1)", "unsupported_value")
        return super().unsupported()


class ChatMessage(BaseModel):
    # extra="forbid": a message field the chat template is not given must not vanish unseen
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr | list[dict] | None = None
    # OpenAI's other message fields: accepted only when absent, null or empty (unsupported_in)
    name: Any = None
    tool_calls: Any = None
    tool_call_id: Any = None
    function_call: Any = None
    refusal: Any = None
    audio: Any = None
    annotations: Any = None

    def unsupported_in(self, where: str) -> Refusal | None:
        """Only role and text content reach the chat template: tool turns and names would be dropped from the
        prompt, so they are refused (``where``: this message's param, e.g. ``messages.[2]``)."""
        if self.role == "tool":
            return Refusal(f"{where}.role", "tool messages are not supported: this server runs no tools",
                           "unsupported_value")
        for name in ("name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio"):
            if given(getattr(self, name)):
                return Refusal(f"{where}.{name}", f"{name} in a message is not supported: only role and text "
                                                  "content reach the chat template")
        return None  # annotations: the server's own output notes (url citations), nothing the model reads

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"only text content parts are supported, got {part.get('type')!r}")
            parts.append(part["text"])
        return "".join(parts)


# OpenAI chat fields the engine cannot honour: refused whenever sent (not null or empty)
CHAT_UNSUPPORTED = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "audio",
                    "prediction", "reasoning_effort", "verbosity", "web_search_options")


class ChatCompletionRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1, le=MAX_INT32)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # accepted when they ask for what the server does anyway (unsupported() checks their values)
    response_format: dict[str, Any] | None = None
    modalities: list[StrictStr] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    # declared so that sending them is refused by name (unsupported_parameter), not reported as unknown
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None

    def unsupported(self) -> Refusal | None:
        for name in CHAT_UNSUPPORTED:
            if given(getattr(self, name)):
                return Refusal(name, f"{name} is not supported: the server samples plain text (no tools, "
                                     "audio, reasoning or output predictions)")
        refusal = self._unsupported_value()
        if refusal is not None:
            return refusal
        for i, message in enumerate(self.messages):
            refusal = message.unsupported_in(f"messages.[{i}]")
            if refusal is not None:
                return refusal
        if self.top_logprobs:
            return Refusal("top_logprobs", "top_logprobs > 0 is not supported: the engine returns the log-prob of "
                                           "the sampled token only", "unsupported_value")
        return super().unsupported()

    def _unsupported_value(self) -> Refusal | None:
        """The fields accepted at their default only: plain text, nothing stored, the default service tier."""
        if self.response_format is not None and self.response_format.get("type") != "text":
            return Refusal("response_format", "response_format other than {\"type\": \"text\"} is not supported: "
                                              "the output is not constrained to JSON", "unsupported_value")
        if self.modalities is not None and self.modalities != ["text"]:
            return Refusal("modalities", 'modalities other than ["text"] are not supported', "unsupported_value")
        if self.store:
            return Refusal("store", "store: true is not supported: the server keeps no completions",
                           "unsupported_value")
        if self.service_tier not in (None, "auto", "default"):
            return Refusal("service_tier", f"service_tier {self.service_tier!r} is not supported (auto or default)",
                           "unsupported_value")
        return None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
