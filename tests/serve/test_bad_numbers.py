"""Issue 34, path 10: numbers out of range or not finite, and bodies that are not UTF-8, are 400s naming the field;
the server stays healthy (a seed of 2**70 used to be a 500 that left /health at 503 until the next request)."""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import MODEL_NAME

HUGE = 2**70


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kwargs)


def completion(**fields) -> dict:
    return {"model": MODEL_NAME, "prompt": "1+1=", "max_tokens": 2, **fields}


def chat(**fields) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2, **fields}


def raw(body: str) -> dict:
    """A JSON text sent as is (Infinity and NaN are not JSON, but Python's parser, which FastAPI uses, reads them)."""
    return {"content": body.encode(), "headers": {"content-type": "application/json"}}


def assert_healthy_and_serving(server) -> None:
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200, health.text
    ok = post(server, "/v1/completions", json=completion(ignore_eos=True))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text


@pytest.mark.parametrize("field, value", [
    ("seed", HUGE), ("seed", -HUGE), ("max_tokens", HUGE), ("n", HUGE), ("top_k", HUGE), ("logprobs", HUGE),
    ("best_of", HUGE), ("best_of", 0), ("temperature", float("inf")), ("top_p", float("nan")),
    ("presence_penalty", float("inf")), ("frequency_penalty", float("nan")),
])
def test_completion_numbers_out_of_range_are_400s_naming_the_field(server, field, value):
    body = completion(**{field: value})
    if isinstance(value, float):  # inf and nan as Python's json writes them (Infinity, NaN)
        import json

        response = post(server, "/v1/completions", **raw(json.dumps(body)))
    else:
        response = post(server, "/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"], response.text
    assert_healthy_and_serving(server)


@pytest.mark.parametrize("text, field", [
    ('"temperature": Infinity', "temperature"), ('"temperature": NaN', "temperature"),
    ('"temperature": -Infinity', "temperature"), ('"temperature": 1e999', "temperature"),
    ('"top_p": NaN', "top_p"), ('"logit_bias": {"5": Infinity}', "logit_bias"),
])
def test_non_finite_numbers_are_400s(server, text, field):
    for path, body in (("/v1/completions", completion()), ("/v1/chat/completions", chat())):
        import json

        response = post(server, path, **raw(json.dumps(body)[:-1] + ", " + text + "}"))
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert field in message and "finite" in message, message


@pytest.mark.parametrize("field", ["seed", "max_tokens", "max_completion_tokens", "n", "top_k", "top_logprobs"])
def test_chat_numbers_out_of_range_are_400s(server, field):
    response = post(server, "/v1/chat/completions", json=chat(**{field: HUGE}))
    assert response.status_code == 400 and field in response.json()["error"]["message"], response.text
    assert_healthy_and_serving(server)


def test_the_largest_seeds_are_served(server):
    for seed in (0, 2**63 - 1, -(2**63)):
        response = post(server, "/v1/completions", json=completion(seed=seed, temperature=1.0))
        assert response.status_code == 200, (seed, response.text)
    assert_healthy_and_serving(server)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_that_is_not_utf8_is_a_400_saying_so(server, path):
    response = post(server, path, content=b'{"model": "tiny-test", "prompt": "\xff\xfe1+1="}',
                    headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "not valid UTF-8" in response.json()["error"]["message"], response.text
    assert_healthy_and_serving(server)
