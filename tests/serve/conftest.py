"""A real uvicorn server on 127.0.0.1 (a free port) in front of the engine with the tiny model, in this process."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import uvicorn  # noqa: E402

from tandemrl.config import validate_config  # noqa: E402
from tandemrl.models.tiny import make_tiny_model  # noqa: E402
from tandemrl.serve.app import build_app  # noqa: E402
from tandemrl.serve.server import HttpIO, bind_socket, build_state, fastest_io, uvicorn_config  # noqa: E402
from tandemrl.serve.state import ServerState  # noqa: E402

MODEL_NAME = "tiny-test"
REPO = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """The environment for a child Python: the repository in front of PYTHONPATH, which keeps what is there (a GPU
    machine's carried wheels live on it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@dataclass
class Running:
    url: str
    state: ServerState
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.state.loop.stop()


def serve_config(model_dir: Path, **engine) -> dict:
    return {"model": {"name_or_path": str(model_dir), "device": "cpu"},
            "engine": {"num_blocks": 256, "block_size": 16, "decode_steps": 4, **engine}}


def start_server(raw: dict, allow_ipc: bool = False, io: HttpIO | None = None) -> Running:
    """``io``: uvicorn's loop and HTTP parser, the fastest installed unless given (as `tandemrl serve` picks)."""
    state = build_state(validate_config(raw), MODEL_NAME, allow_ipc)
    state.loop.start()
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(build_app(state), io or fastest_io()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{port}", state, server, thread)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(tiny_dir):
    running = start_server(serve_config(tiny_dir))
    yield running
    running.stop()
