"""A small HTTP client of a `tandemrl serve` process, for the trainer's weight pushes (httpx). Here in sync/, beside
the kinds that post with it: the server imports sync's receiver, so sync imports nothing of serve."""

from __future__ import annotations

from typing import Any

import httpx


class ServerError(ConnectionError):
    """The server answered with an error (the message is the server's), or did not answer (status 0)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServerClient:
    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=10.0))

    def get(self, path: str) -> dict:
        return _json(self._send("GET", path))

    def post(self, path: str, body: dict | None = None, content: bytes | None = None,
             params: dict[str, Any] | None = None) -> dict:
        if content is not None:
            return _json(self._send("POST", path, content=content, params=params,
                                    headers={"content-type": "application/octet-stream"}))
        return _json(self._send("POST", path, json=body or {}, params=params))

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerError(f"{method} {self.url}{path}: the server did not answer ({type(exc).__name__}: "
                              f"{exc})", 0) from exc

    def close(self) -> None:
        self._http.close()


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = error.get("message") if isinstance(error, dict) else None
        raise ServerError(f"{response.request.method} {response.request.url}: {response.status_code} "
                          f"{message or response.text[:200]}", response.status_code)
    return body
