"""The FastAPI application: OpenAI routes, /health, /metrics and the weight routes (weights_routes.py).

Every error is OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: a 4xx status and type
``invalid_request_error`` for the client's mistakes (bad JSON, wrong types, unknown or unsupported fields, unknown
model, too many tokens), a 5xx and ``server_error`` for the server's; ``param`` names the field at fault and
``code`` is a string (``model_not_found``, ``unknown_parameter``, ...), each null where there is none. The server
keeps serving either way. Every response carries the served policy version in the ``x-policy-version`` header; the
completion bodies carry the version that produced them (``policy_version``, per choice too).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Sequence, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandemrl.serve.completions import chat_job, completion_job, respond, stream
from tandemrl.serve.metrics import prometheus_text
from tandemrl.serve.protocol import ChatCompletionRequest, CompletionRequest, error_body
from tandemrl.serve.state import BadRequest, ServerState
from tandemrl.serve.weights_routes import add_weight_routes

VERSION_HEADER = "x-policy-version"
BodyModel = TypeVar("BodyModel", CompletionRequest, ChatCompletionRequest)


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="tandemrl", docs_url=None, redoc_url=None)
    app.state.serving = state
    _add_error_handlers(app)

    app.add_middleware(PolicyVersionHeader, state=state)

    @app.get("/health")
    async def health() -> Response:
        if not state.loop.alive:
            return _error(503, "the engine thread has stopped")
        if state.loop.last_error is not None:
            return _error(503, f"the engine's last step failed: {state.loop.last_error.splitlines()[-1]}")
        return JSONResponse({"status": "ok", "policy_version": state.policy_version})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": int(state.started),
                                            "owned_by": "tandemrl", "max_model_len": state.max_model_len,
                                            "policy_version": state.policy_version}]}

    # Plain starlette routes: FastAPI's dependency solving cost ~0.1 ms of event-loop time per request, paid 64
    # times over before the last of 64 requests arriving together reaches the engine (bench/RESULTS.md, issue 40).
    async def completions(request: Request) -> Response:
        return await _serve(state, completion_job(state, await _body(request, CompletionRequest)), request)

    async def chat_completions(request: Request) -> Response:
        return await _serve(state, chat_job(state, await _body(request, ChatCompletionRequest)), request)

    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])

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
    started (the client left first): an idle engine must not wait for a request that will never come.

    It streams in the request's own task and watches for the client's disconnect in one plain asyncio task, which
    cancels the stream (and with it the request's sequences, state.run). Starlette's StreamingResponse runs both in an
    anyio task group instead, whose cancellation costs ~0.4 ms of event-loop time per request (bench/RESULTS.md,
    issue 40): with 64 requests arriving together, 25 ms before the last one reaches the engine."""

    def __init__(self, content: AsyncIterator[str], arrived: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._arrived = arrived

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        disconnected = False

        async def cancel_on_disconnect() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            streaming.cancel()

        watcher = asyncio.ensure_future(cancel_on_disconnect())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not disconnected:
                raise  # cancelled from outside (the server stops), not by the client's leaving
            if hasattr(streaming, "uncancel"):  # Python 3.11+ counts cancellations; 3.10 has no count to undo
                streaming.uncancel()
        finally:
            watcher.cancel()
            self._arrived()


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error body; the type follows the status (the client's fault or the server's)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(exc.status, str(exc), exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        invalid = _invalid(exc.errors())
        return _error(invalid.status, str(invalid), invalid.param, invalid.code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI says only "There was an error parsing the body"
            return _error(400, f"the body is not valid UTF-8: {exc.__cause__}")
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}")


async def _body(request: Request, model: type[BodyModel]) -> BodyModel:
    """The request body as ``model``, parsed as FastAPI would (Python's JSON parser, then pydantic); BadRequest
    naming each problem otherwise."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not valid UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc.errors()) from None


# pydantic's error types that have an OpenAI error code of their own
_CODES = {"extra_forbidden": "unknown_parameter", "missing": "missing_required_parameter"}


def _invalid(errors: Sequence[Any]) -> BadRequest:
    """A BadRequest for a body that failed validation: every problem in the message, the first one's field as
    ``param`` and its OpenAI code."""
    first = errors[0] if errors else {}
    return BadRequest(_describe_validation(errors), param=_param(first) or None, code=_CODES.get(first.get("type")))


def _param(err: Any) -> str:
    """OpenAI's spelling of an error's field, ``messages.[0].role``. pydantic adds the union member it tried
    (``prompt.str``) after a field name: the path stops at a name that follows a name, except for an unknown field,
    whose path has no such member and whose last name is the point."""
    path: list[str] = []
    for part in (p for p in err.get("loc", ()) if p not in ("body", "query")):
        if isinstance(part, int):
            path.append(f"[{part}]")
        elif path and not path[-1].startswith("[") and err.get("type") != "extra_forbidden":
            break
        else:
            path.append(str(part))
    return ".".join(path)


def _describe_validation(errors: Sequence[Any]) -> str:
    """One line per problem, naming the field: 'max_tokens: Input should be a valid integer (got "ten")'."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
            continue
        where = ".".join(loc) or "body"
        if err.get("type") == "extra_forbidden":  # pydantic's "Extra inputs are not permitted" does not say why
            parts.append(f"{where}: unknown parameter (neither an OpenAI field this server knows nor one of its "
                         "extensions)")
            continue
        got = f" (got {err['input']!r})" if "input" in err and err.get("type") != "missing" else ""
        parts.append(f"{where}: {err.get('msg')}{got}")
    return "; ".join(parts[:5])
