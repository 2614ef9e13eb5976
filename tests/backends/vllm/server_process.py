"""Start and stop a real vLLM OpenAI server for server mode's tests (the vLLM environment's own python)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[3]
# Measured on the shared 2-core CI machine: 26-44 s to /health; the limit leaves room for a loaded machine.
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(model_dir: Path, port: int) -> list[str]:
    """What the README tells users to run (float32 here: compared with our engine's float32)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--seed", "0",
            "--enforce-eager", "--max-model-len", "512", "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", "tandemrl.backends.vllm.extension.TandemrlWorkerExtension"]


@contextlib.contextmanager
def start_server(model_dir: Path, log_path: Path) -> Iterator[str]:
    """The server's URL once /health answers; the server is stopped on exit. One engine process: the engine core
    in the API server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0) starts faster on two cores."""
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(server_command(model_dir, port), stdout=log, stderr=subprocess.STDOUT, env=env)
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
