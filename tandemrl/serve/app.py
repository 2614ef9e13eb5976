"""The FastAPI application: OpenAI routes, /health, /metrics and the weight routes (weights_routes.py).

Every error is an OpenAI-style body ``{"error": {"message", "type", "code"}}`` with a 4xx status for the client's
mistakes (bad JSON, wrong types, unknown model, too many tokens) and 5xx for the server's; the server keeps
serving either way. Every response carries the served policy version in the ``x-policy-version`` header; the
completion bodies carry the version that produced them (``policy_version``, per choice too).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandemrl.serve.completions import chat_job, completion_job, respond, stream
from tandemrl.serve.metrics import prometheus_text
from tandemrl.serve.protocol import ChatCompletionRequest, CompletionRequest
from tandemrl.serve.state import BadRequest, ServerState
from tandemrl.serve.weights_routes import add_weight_routes

VERSION_HEADER = "x-policy-version"


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="tandemrl", docs_url=None, redoc_url=None)
    app.state.serving = state
    _add_error_handlers(app)

    app.add_middleware(PolicyVersionHeader, state=state)

    @app.get("/health")
    async def health() -> Response:
        if not state.loop.alive:
            return _error(503, "the engine thread has stopped", "server_error")
        if state.loop.last_error is not None:
            return _error(503, f"the engine's last step failed: {state.loop.last_error.splitlines()[-1]}",
                          "server_error")
        return JSONResponse({"status": "ok", "policy_version": state.policy_version})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": int(state.started),
                                            "owned_by": "tandemrl", "max_model_len": state.max_model_len,
                                            "policy_version": state.policy_version}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _serve(state, completion_job(state, body), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _serve(state, chat_job(state, body), request)

    add_weight_routes(app, state)
    return app


class PolicyVersionHeader:
    """Adds ``x-policy-version`` to every response. A plain ASGI middleware: starlette's BaseHTTPMiddleware would
    hide a client's disconnect from the routes (``request.is_disconnected()``)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append(VERSION_HEADER, str(self.state.policy_version))
            await send(message)

        await self.app(scope, receive, send_with_version)


async def _serve(state: ServerState, job, request: Request) -> Response:  # noqa: ANN001 - completions.Job
    arrived = state.arrivals.take()  # an idle engine waits for it (engine_loop.py); released at its submit
    if job.body.stream:
        return _EngineStream(stream(state, job, arrived), arrived)
    try:
        body = await respond(state, job, request.is_disconnected, arrived)
    finally:
        arrived()
    if body is None:  # the client went away; nobody reads this
        return Response(status_code=499)
    return JSONResponse(body)


class _EngineStream(StreamingResponse):
    """An SSE response that releases its request's Arrivals count however it ends, also when the stream never
    started (the client left first): an idle engine must not wait for a request that will never come."""

    def __init__(self, content: AsyncIterator[str], arrived: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._arrived = arrived

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._arrived()


def _error(status: int, message: str, kind: str, code: str | int | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code if code is not None else status}},
                        status_code=status)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(exc.status, str(exc), exc.code)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, _describe_validation(exc), "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI says only "There was an error parsing the body"
            return _error(400, f"the body is not valid UTF-8: {exc.__cause__}", "invalid_request_error")
        return _error(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")


def _describe_validation(exc: RequestValidationError) -> str:
    """One line per problem, naming the field: 'max_tokens: Input should be a valid integer (got "ten")'."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
            continue
        where = ".".join(loc) or "body"
        got = f" (got {err['input']!r})" if "input" in err and err.get("type") != "missing" else ""
        parts.append(f"{where}: {err.get('msg')}{got}")
    return "; ".join(parts[:5])
