"""Start and stop a local vLLM OpenAI server, as the README tells users to (server mode's tests and benchmark).

Runs ``python -m vllm.entrypoints.openai.api_server`` with the given python (default: this one, which must have
vLLM); this module itself imports no vLLM.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import httpx

REPO = Path(__file__).resolve().parents[3]  # on PYTHONPATH, so the worker extension imports in the server
# Measured on the shared 2-core CI machine: 26-44 s to /health; the limit leaves room for a loaded machine.
START_TIMEOUT_S = 240.0
EXTENSION = "tandemrl.backends.vllm.extension.TandemrlWorkerExtension"  # = extension.EXTENSION (no torch import)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(model_dir: Path, port: int, dtype: str = "float32", max_model_len: int = 512,
                   extra: Sequence[str] = ("--enforce-eager",), python: str = sys.executable) -> list[str]:
    """What the README tells users to run: sampled log-probs after temperature (as the trainer's), the worker
    extension for rollout.vllm.weight_transfer = "http"."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--seed", "0",
            "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", EXTENSION, *extra]


@contextlib.contextmanager
def start_server(model_dir: Path, log_path: Path, multiprocessing: bool = False, **command: Any) -> Iterator[str]:
    """The server's URL once /health answers; the server is stopped on exit. ``command``: server_command's
    options. ``multiprocessing`` False: the engine core in the API server's process (starts faster on two cores);
    True: vLLM's default, its own process. A 1 GiB KV cache on a CPU unless the environment sets one."""
    port = free_port()
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", **os.environ, "VLLM_SERVER_DEV_MODE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocessing else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(server_command(model_dir, port, **command), stdout=log,
                                   stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {process.returncode}:\n{_tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the vLLM server did not answer /health within {START_TIMEOUT_S:.0f} s:\n{_tail(log_path)}")


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:]
