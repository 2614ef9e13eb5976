"""uvicorn's event loop and HTTP parser: `tandemrl serve` takes uvloop and httptools (C) where installed and runs on
asyncio's loop and h11 (pure Python) where they are not; both serve the same."""

from __future__ import annotations

import json

import httpx
import pytest

from tandemrl.serve.server import HttpIO, fastest_io
from tests.serve.conftest import MODEL_NAME, serve_config, start_server

FAST, PLAIN = HttpIO("uvloop", "httptools"), HttpIO("asyncio", "h11")
PROTOCOL = {"httptools": "HttpToolsProtocol", "h11": "H11Protocol"}


def test_the_c_loop_and_parser_are_taken_where_installed():
    assert fastest_io(lambda package: True) == FAST
    assert fastest_io(lambda package: False) == PLAIN
    assert fastest_io(lambda package: package == "httptools") == HttpIO("asyncio", "httptools")


@pytest.mark.parametrize("io", [PLAIN, FAST], ids=["asyncio+h11", "uvloop+httptools"])
def test_either_serves_streamed_and_plain_completions(tiny_dir, io):
    if io == FAST:  # optional: no extra installs them
        pytest.importorskip("uvloop")
        pytest.importorskip("httptools")
    running = start_server(serve_config(tiny_dir), io=io)
    try:
        assert running.server.config.http_protocol_class.__name__ == PROTOCOL[io.http]
        assert type(running.server.servers[0].get_loop()).__module__.split(".")[0] == io.loop
        body = {"model": MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True,
                "return_token_ids": True}
        with httpx.Client(base_url=running.url, timeout=30) as http:
            plain = http.post("/v1/completions", json=body)
            assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 4
            with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        ids = [i for line in lines[:-1] for i in json.loads(line[6:])["choices"][0].get("token_ids", [])]
        assert len(ids) == 4
    finally:
        running.stop()
