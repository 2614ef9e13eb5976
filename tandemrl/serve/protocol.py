"""The OpenAI request bodies the server accepts (pydantic), and how they map onto the engine's SamplingParams.

Extensions beside OpenAI's fields (vLLM spells them the same): ``top_k``, ``ignore_eos``, ``return_token_ids``
(each choice carries its completion's token ids, the response the prompt's). Fields the engine cannot honour
(``echo``, ``best_of`` > n, penalties, ``logit_bias``, ``suffix``, more than the sampled token's log-prob) are
refused with a message rather than ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from tandemrl.types import SamplingParams

MAX_N = 128
MAX_INT32 = 2**31 - 1  # token counts and top_k: far above any context, and what the engine's tensors hold
INT64 = 2**63  # a seed is an int64 (torch.Generator's, OpenAI's and vLLM's range)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class _Body(BaseModel):
    # Clients send fields we have no use for (user, metadata, service_tier ...): ignored, as OpenAI-compatible
    # servers do; the ones that would change the output are checked in `unsupported()`.
    # allow_inf_nan: Python's JSON parser reads Infinity, NaN and 1e999; no sampling setting means anything there
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: StrictStr
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_INT32)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=0, le=MAX_INT32)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: dict | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = Field(None, ge=-INT64, lt=INT64)
    ignore_eos: StrictBool = False
    return_token_ids: StrictBool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

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

    def unsupported(self) -> str | None:
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty and frequency_penalty are not supported (leave them 0)"
        if self.logit_bias:
            return "logit_bias is not supported"
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

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of other than n is not supported"
        if self.suffix:
            return "suffix is not supported"
        if self.logprobs is not None and self.logprobs > 1:
            return ("logprobs > 1 is not supported: the engine returns the log-prob of the sampled token only "
                    "(ask for logprobs=1)")
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr | list[dict] | None = None

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


class ChatCompletionRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1, le=MAX_INT32)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def unsupported(self) -> str | None:
        if self.top_logprobs:
            return "top_logprobs > 0 is not supported: the engine returns the log-prob of the sampled token only"
        return super().unsupported()

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
