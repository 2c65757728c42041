"""The OJS 1.0 HTTP binding's plumbing: the error contract, bodies, media types and headers.

Bodies are parsed by hand, not by request models: an empty or malformed body
must be `400 invalid_payload` (a model layer would answer 422), and a wrong
field is the OJS error body naming it. Every response, the router's own 404
and 405 included, is `application/openjobspec+json` (no charset) with
`OJS-Version: 1.0` and an `X-Request-Id`.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from seamq import codec
from seamq.jobs import attempts
from seamq.jobs.model import OjsError, invalid

MEDIA_TYPE = "application/openjobspec+json"
VERSION = "1.0"
MAX_BODY = 16 * 1024 * 1024
_OJS_TYPE = MEDIA_TYPE.encode()
_OURS = (b"ojs-version", b"x-request-id")


class OjsResponse(JSONResponse):
    media_type = MEDIA_TYPE

    def render(self, content: Any) -> bytes:
        return codec.dumps(content)


def answer(content: Any, status: int = 200) -> OjsResponse:
    return OjsResponse(content, status_code=status)


async def body_of(request: Request) -> dict:
    too_big = OjsError(413, "invalid_payload", f"request body larger than {MAX_BODY} bytes")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():  # stop reading at the limit: a 1 GB body never lands in memory
        size += len(chunk)
        if size > MAX_BODY:
            raise too_big
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise OjsError(400, "invalid_payload", "the request body is empty: send a JSON object")
    try:
        body = codec.loads(raw)
    except RecursionError:
        raise OjsError(400, "invalid_payload", "the request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # the parser's reason and where (never the body's content)
        raise OjsError(400, "invalid_payload", f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise OjsError(400, "invalid_payload", "the request body must be a JSON object")
    return body


def limit_of(text: str | None, default: int = 100, most: int = 1000) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        raise invalid(f"limit {text!r} is not an integer") from None
    if value < 1:
        raise invalid(f"limit must be at least 1, got {value}")
    return min(value, most)  # more than the most is a page of the most, with has_more


def media_type_for(headers: dict[bytes, bytes]) -> str:
    """`application/openjobspec+json`, as the binding says (§4.3), but `application/json` for a
    client that accepts only that, and for the official Python SDK (openjobspec 0.4.0): it asks for
    the OJS type, then parses a successful body only if the answer's type contains
    `application/json`, and otherwise hands its caller `{"_raw": ...}` (every call fails). It is
    known by its HTTP library's User-Agent (`python-httpx/`); to any JSON client both types are
    the same bytes. docs/jobs.md, "SDK compatibility"."""
    accept = headers.get(b"accept", b"").decode("latin-1").lower()
    if "application/json" in accept and "openjobspec" not in accept:
        return "application/json"
    if headers.get(b"user-agent", b"").startswith(b"python-httpx/"):
        return "application/json"
    return MEDIA_TYPE


class OjsHeaders:
    """ASGI wrapper: `OJS-Version` and `X-Request-Id` on every response, errors of the server itself
    included (outside Starlette's own error middleware)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_headers = dict(scope.get("headers") or [])
        given = request_headers.get(b"x-request-id", b"")[:200]
        request_id = given.decode("latin-1") if given else os.urandom(16).hex()  # a third of uuid4's cost
        scope.setdefault("state", {})["request_id"] = request_id
        media_type = media_type_for(request_headers)
        ours = [(b"ojs-version", VERSION.encode()), (b"x-request-id", request_id.encode("latin-1"))]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0] not in _OURS]
                if media_type != MEDIA_TYPE:
                    headers = [(k, media_type.encode() if k == b"content-type" and v == _OJS_TYPE else v)
                               for k, v in headers]
                message["headers"] = headers + ours
            await send(message)

        await self.app(scope, receive, sending)


class FixedPaths:
    """ASGI: a request to a route whose path has no parameter (fetch, ack, push: most of a busy server's
    requests) goes straight to its endpoint, and an error it raises to the handler of its type, as
    Starlette routes them; any other request to `app`, Starlette's own middleware and router, whose
    layers around every request were the job server's largest cost after the engine's own
    (docs/benchmarks.md 7y). A path with a parameter, a method a route does not take and a mount go
    through `app` unchanged."""

    def __init__(self, app, routes: Sequence[BaseRoute], handlers: dict[type[Exception], Any]) -> None:
        self.app, self.handlers = app, handlers
        self.endpoints = {(method, route.path): route.endpoint for route in routes
                          if isinstance(route, Route) and not route.param_convertors
                          and inspect.iscoroutinefunction(route.endpoint) for method in route.methods or ()}

    async def __call__(self, scope, receive, send) -> None:
        endpoint = self.endpoints.get((scope.get("method"), scope.get("path"))) \
            if scope["type"] == "http" and not scope.get("root_path") else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = next((self.handlers[kind] for kind in type(exc).__mro__
                            if kind in self.handlers and kind is not Exception), None)
            if handler is None:  # Starlette's last resort: `Exception`'s handler answers, the error goes on to be logged
                if Exception in self.handlers:
                    await (await self.handlers[Exception](request, exc))(scope, receive, send)
                raise
            response = await handler(request, exc)
            exc.__traceback__ = None  # an error raised again and again keeps no tracebacks
        await response(scope, receive, send)


def may_wait(request: Request) -> float:
    """Seconds the request's ack or nack may wait to share the store's batch (seamq.jobs.attempts)."""
    return attempts.may_wait(request.headers.get(attempts.MAY_WAIT_HEADER))
