"""HTTP to a vLLM OpenAI server (server mode), with errors that name the server and the fix.

Only vLLM's public routes: ``/version``, ``/v1/models``, ``/v1/completions``, and the development routes that
``VLLM_SERVER_DEV_MODE=1`` turns on (``/collective_rpc``, ``/reset_prefix_cache``, ``/pause``, ``/resume``,
``/weight_info``, ``/update_weight_version``). No vLLM import: the trainer's environment need not have vLLM.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tandemrl.backends.vllm.errors import VLLMBackendError, VLLMServerError

try:
    import httpx
except ImportError as exc:  # a clear error where the trainer's environment lacks the client
    raise VLLMBackendError(f"rollout.vllm.mode = 'server' needs httpx ({exc}): "
                           "pip install 'tandemrl[vllm-server]'") from exc

LAUNCH_HINT = ("start it with `VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model MODEL "
               "--logprobs-mode processed_logprobs --worker-extension-cls "
               "tandemrl.backends.vllm.extension.TandemrlWorkerExtension` (README, vLLM server mode)")
DEV_ROUTES = ("/collective_rpc", "/reset_prefix_cache", "/pause", "/resume", "/weight_info", "/update_weight_version")


@dataclass(frozen=True)
class ServerInfo:
    version: str
    model: str  # the served model's name, as /v1/completions wants it
    max_model_len: int


class ServerClient:
    def __init__(self, url: str, timeout_s: float, max_concurrency: int = 64,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.max_concurrency = max_concurrency
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._http = httpx.Client(base_url=self.url, timeout=self._timeout, transport=transport)
        self._async_transport = async_transport

    def handshake(self) -> ServerInfo:
        """What the backend needs before its first request; a clear error when the server cannot serve it."""
        try:
            version = self.get("/version")["version"]
        except VLLMServerError as exc:
            cause = exc.__cause__ or exc
            raise VLLMBackendError(f"no vLLM server answers at {self.url} ({type(cause).__name__}: {cause}); "
                                   f"{LAUNCH_HINT}") from exc
        models = self.get("/v1/models")["data"]
        if not models:
            raise VLLMBackendError(f"the vLLM server at {self.url} serves no model")
        self.get("/weight_info")  # a development route: fails now, not at the first weight update
        return ServerInfo(str(version), str(models[0]["id"]), int(models[0].get("max_model_len") or 0))

    def get(self, path: str) -> Any:
        return self._send("GET", path)

    def post(self, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
        return self._send("POST", path, body, params)

    def collective_rpc(self, method: str, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
        """One method on every worker of the server (vLLM's own, or the worker extension's)."""
        body = {"method": method, "args": args or [], "kwargs": kwargs or {}}
        try:
            return self.post("/collective_rpc", body)
        except VLLMServerError as exc:
            if "is not implemented" in str(exc):
                raise VLLMBackendError(f"the vLLM server at {self.url} has no worker method {method!r}: "
                                       f"{LAUNCH_HINT}") from exc
            raise

    def completions(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any] | str]:
        """POST /v1/completions for every body at once: each response, or its error message for a 4xx (that
        request fails alone). The server not answering, or a 5xx, fails the call."""
        return asyncio.run(self._completions(bodies))

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ internals

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None,
              params: dict[str, Any] | None = None) -> Any:
        for attempt in (1, 2):
            try:
                response = self._http.request(method, path, json=body, params=params)
                break
            except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
                if attempt == 1:  # vLLM 0.32 drops the kept-alive connection after a failed request (_compat)
                    continue
                raise VLLMServerError(f"the vLLM server at {self.url} did not answer {method} {path} "
                                      f"({type(exc).__name__}: {exc})") from exc
            except httpx.HTTPError as exc:
                raise VLLMServerError(f"the vLLM server at {self.url} did not answer {method} {path} "
                                      f"({type(exc).__name__}: {exc})") from exc
        self._raise_for_status(method, path, response)
        return response.json() if response.content else None

    def _raise_for_status(self, method: str, path: str, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        if response.status_code == 404 and path in DEV_ROUTES:
            raise VLLMBackendError(f"the vLLM server at {self.url} has no {path} route: it was started without "
                                   f"VLLM_SERVER_DEV_MODE=1, which server mode needs for weight updates; "
                                   f"{LAUNCH_HINT}")
        raise VLLMServerError(f"the vLLM server at {self.url} failed {method} {path}: {response.status_code} "
                              f"{error_message(response)}")

    async def _completions(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any] | str]:
        limit = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(base_url=self.url, timeout=self._timeout, transport=self._async_transport,
                                     limits=httpx.Limits(max_connections=self.max_concurrency)) as http:

            async def one(body: dict[str, Any]) -> dict[str, Any] | str:
                async with limit:
                    try:
                        response = await http.post("/v1/completions", json=body)
                    except httpx.HTTPError as exc:
                        raise VLLMServerError(f"the vLLM server at {self.url} did not answer POST /v1/completions "
                                              f"({type(exc).__name__}: {exc})") from exc
                if 400 <= response.status_code < 500:
                    return error_message(response)
                self._raise_for_status("POST", "/v1/completions", response)
                return response.json()

            return list(await asyncio.gather(*(one(body) for body in bodies)))


def error_message(response: httpx.Response) -> str:
    """vLLM's error text ({"error": {"message": ...}}, {"error": "..."}, {"detail": ...}), else the body's start."""
    try:
        body = response.json()
        error = body.get("error") or body.get("detail") if isinstance(body, dict) else None
    except ValueError:
        error = None
    if isinstance(error, dict):
        error = error.get("message")
    return str(error or response.text[:300])
