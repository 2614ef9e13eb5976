"""The server through the official openai client: completions and chat, streaming and not, n, stop strings,
seeds, log-probs and token ids, models, health, metrics, the policy version on every response."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.serve.conftest import MODEL_NAME  # noqa: E402


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.headers["x-policy-version"] == "0"
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("requests_waiting", "requests_running", "kv_cache_usage", "tokens_per_second", "running_version_lag"):
        assert f"\ntandemrl_{name} " in "\n" + metrics, name


def test_completion_with_logprobs_and_token_ids(server, client):
    out = client.completions.create(model=MODEL_NAME, prompt="3+4=", max_tokens=8, temperature=0, logprobs=1,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    ids = choice.model_extra["token_ids"]
    assert len(ids) == 8 and out.usage.completion_tokens == 8
    tok = server.state.tokenizer
    assert out.model_extra["prompt_token_ids"] == tok("3+4=", add_special_tokens=False)["input_ids"]
    assert choice.text == tok.decode(ids, skip_special_tokens=True)
    assert len(choice.logprobs.token_logprobs) == 8 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert out.model_extra["policy_version"] == 0 and choice.model_extra["policy_version"] == 0
    # greedy: the same request gives the same tokens
    again = client.completions.create(model=MODEL_NAME, prompt="3+4=", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
    assert again.choices[0].model_extra["token_ids"] == ids


def test_n_and_seed(client):
    def sample(seed: int) -> list[str]:
        out = client.completions.create(model=MODEL_NAME, prompt="1+1=", max_tokens=12, n=3, seed=seed,
                                        temperature=1.0, extra_body={"ignore_eos": True})
        assert [c.index for c in out.choices] == [0, 1, 2]
        return [c.text for c in out.choices]

    first = sample(7)
    assert sample(7) == first  # same seed, same completions
    assert sample(8) != first
    assert len(set(first)) > 1  # n samples are not copies of one


def test_stop_string_cuts_the_text(client):
    out = client.completions.create(model=MODEL_NAME, prompt="9+9=", max_tokens=40, temperature=0,
                                    extra_body={"ignore_eos": True})
    text = out.choices[0].text
    assert len(text) >= 4
    stop = text[2:4]
    cut = client.completions.create(model=MODEL_NAME, prompt="9+9=", max_tokens=40, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_streaming_completion_equals_the_whole_one(client):
    whole = client.completions.create(model=MODEL_NAME, prompt="5+2=", max_tokens=30, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="5+2=", max_tokens=30, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True, "return_token_ids": True}))
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # it streamed, not one blob
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    ids = [t for c in chunks for t in c.choices[0].model_extra.get("token_ids", [])]
    assert ids == whole.choices[0].model_extra["token_ids"]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.model_extra["policy_version"] == 0 for c in chunks)


def test_streaming_with_a_stop_string_never_sends_past_it(client):
    whole = client.completions.create(model=MODEL_NAME, prompt="8+1=", max_tokens=40, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    stop = whole[5:7]
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="8+1=", max_tokens=40, temperature=0,
                                            stop=stop, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == whole[:whole.index(stop)]


def test_chat_completion_and_stream(client):
    messages = [{"role": "user", "content": "2+2="}]
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0,
                                         logprobs=True, extra_body={"ignore_eos": True})
    message = out.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert len(out.choices[0].logprobs.content) == 10
    assert out.model_extra["policy_version"] == 0
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == message.content
    assert chunks[-1].usage.completion_tokens == 10
