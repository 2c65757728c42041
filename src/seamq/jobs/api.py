"""The OJS 1.0 HTTP binding: Starlette routes over the engine, and the error contract.

Bodies are parsed by hand, not by request models: an empty or malformed body
must be `400 invalid_payload` (a model layer would answer 422), and a wrong
field is the OJS error body naming it. Every response, the router's own 404
and 405 included, is `application/openjobspec+json` (no charset) with
`OJS-Version: 1.0` and an `X-Request-Id`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from seamq.jobs.engine import Engine
from seamq.jobs.model import OjsError, invalid
from seamq.observability import log

MEDIA_TYPE = "application/openjobspec+json"
VERSION = "1.0"
MAX_BODY = 16 * 1024 * 1024


class OjsResponse(JSONResponse):
    media_type = MEDIA_TYPE

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()


def _answer(content: Any, status: int = 200) -> OjsResponse:
    return OjsResponse(content, status_code=status)


async def _body(request: Request) -> dict:
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
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise OjsError(400, "invalid_payload", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise OjsError(400, "invalid_payload", "the request body must be a JSON object")
    return body


def _limit(text: str | None, default: int = 100, most: int = 1000) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        raise invalid(f"limit {text!r} is not an integer") from None
    if value < 1:
        raise invalid(f"limit must be at least 1, got {value}")
    return min(value, most)  # more than the most is a page of the most, with has_more


def build_app(engine: Engine, *, test_mode: bool = False, conformance_level: int = 4) -> "OjsHeaders":
    async def push(request: Request) -> Response:
        status, job = await engine.push(await _body(request))
        return _answer({"job": job}, status)

    async def push_batch(request: Request) -> Response:
        jobs = await engine.push_batch(await _body(request))
        return _answer({"jobs": jobs, "count": len(jobs)}, 201)

    async def info(request: Request) -> Response:
        return _answer({"job": engine.info(request.path_params["job_id"])})

    async def cancel(request: Request) -> Response:
        return _answer({"job": await engine.cancel(request.path_params["job_id"])})

    async def fetch(request: Request) -> Response:
        body = await _body(request)
        jobs = await engine.fetch(body.get("queues"), body.get("count", 1), body.get("worker_id"),
                                  body.get("visibility_timeout_ms"))
        return _answer({"jobs": jobs})

    async def ack(request: Request) -> Response:
        body = await _body(request)
        return _answer(await engine.ack(body.get("job_id"), body.get("result")))

    async def nack(request: Request) -> Response:
        body = await _body(request)
        return _answer(await engine.nack(body.get("job_id"), body.get("error"), body.get("requeue", False)))

    async def heartbeat(request: Request) -> Response:
        body = await _body(request)
        return _answer(await engine.heartbeat(body.get("worker_id"), body.get("active_jobs"),
                                              body.get("visibility_timeout_ms")))

    async def events(request: Request) -> Response:
        params = request.query_params
        split = lambda name: [v for v in (params.get(name) or "").split(",") if v]  # noqa: E731
        try:
            after = int(params.get("after") or 0)
        except ValueError:
            raise invalid("after must be a cursor from an earlier answer") from None
        return _answer(engine.list_events(split("types"), split("queues"), _limit(params.get("limit")), after))

    async def dead_letters(request: Request) -> Response:
        return _answer(engine.dead_letters(request.query_params.get("queue"),
                                           _limit(request.query_params.get("limit"))))

    async def delete_dead_letter(request: Request) -> Response:
        return _answer(await engine.delete_dead_letter(request.path_params["job_id"]))

    async def retry_dead_letter(request: Request) -> Response:
        return _answer({"job": await engine.retry_dead_letter(request.path_params["job_id"])})

    async def create_workflow(request: Request) -> Response:
        return _answer({"workflow": await engine.create_workflow(await _body(request))}, 201)

    async def workflow(request: Request) -> Response:
        return _answer({"workflow": engine.workflow(request.path_params["workflow_id"])})

    async def cancel_workflow(request: Request) -> Response:
        return _answer({"workflow": await engine.cancel_workflow(request.path_params["workflow_id"])})

    async def register_cron(request: Request) -> Response:
        return _answer({"cron": await engine.register_cron(await _body(request))}, 201)

    async def list_crons(request: Request) -> Response:
        return _answer({"crons": engine.crons()})

    async def delete_cron(request: Request) -> Response:
        return _answer({"cron": await engine.delete_cron(request.path_params["name"])})

    async def queue_stats(request: Request) -> Response:
        return _answer({"queue": engine.queue_stats(request.path_params["name"])})

    async def pause(request: Request) -> Response:
        return _answer({"queue": await engine.set_paused(request.path_params["name"], True)})

    async def resume(request: Request) -> Response:
        return _answer({"queue": await engine.set_paused(request.path_params["name"], False)})

    async def health(request: Request) -> Response:
        return _answer({"status": "ok", "version": VERSION})

    async def manifest(request: Request) -> Response:
        return _answer({
            "specversion": VERSION, "ojs_version": VERSION,
            "implementation": {"name": "seamq", "language": "python", "homepage": "docs/jobs.md"},
            "conformance_level": conformance_level, "protocols": ["http"],
            "backend": "nats-jetstream-kv",
        })

    async def reset(request: Request) -> Response:
        await engine.reset()
        return _answer({"reset": True})

    routes = [
        Route("/ojs/v1/jobs", push, methods=["POST"]),
        Route("/ojs/v1/jobs/batch", push_batch, methods=["POST"]),
        Route("/ojs/v1/jobs/{job_id}", info, methods=["GET"]),
        Route("/ojs/v1/jobs/{job_id}", cancel, methods=["DELETE"]),
        Route("/ojs/v1/workers/fetch", fetch, methods=["POST"]),
        Route("/ojs/v1/workers/ack", ack, methods=["POST"]),
        Route("/ojs/v1/workers/nack", nack, methods=["POST"]),
        Route("/ojs/v1/workers/heartbeat", heartbeat, methods=["POST"]),
        Route("/ojs/v1/events", events, methods=["GET"]),
        Route("/ojs/v1/dead-letter", dead_letters, methods=["GET"]),
        Route("/ojs/v1/dead-letter/{job_id}", delete_dead_letter, methods=["DELETE"]),
        Route("/ojs/v1/dead-letter/{job_id}/retry", retry_dead_letter, methods=["POST"]),
        Route("/ojs/v1/workflows", create_workflow, methods=["POST"]),
        Route("/ojs/v1/workflows/{workflow_id}", workflow, methods=["GET"]),
        Route("/ojs/v1/workflows/{workflow_id}", cancel_workflow, methods=["DELETE"]),
        Route("/ojs/v1/cron", register_cron, methods=["POST"]),
        Route("/ojs/v1/cron", list_crons, methods=["GET"]),
        Route("/ojs/v1/cron/{name}", delete_cron, methods=["DELETE"]),
        Route("/ojs/v1/queues/{name}/stats", queue_stats, methods=["GET"]),
        Route("/ojs/v1/queues/{name}/pause", pause, methods=["POST"]),
        Route("/ojs/v1/queues/{name}/resume", resume, methods=["POST"]),
        Route("/ojs/v1/health", health, methods=["GET"]),
        Route("/ojs/manifest", manifest, methods=["GET"]),
    ]
    if test_mode:
        routes.append(Route("/ojs/v1/admin/reset", reset, methods=["POST"]))

    async def ojs_error(request: Request, exc: OjsError) -> Response:
        return _answer(exc.body(getattr(request.state, "request_id", None)), exc.status)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        error = OjsError(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}")
        return _answer(error.body(), exc.status_code)

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("ojs_request_failed", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return _answer(OjsError(500, "backend_error", "internal error; see the server log").body(), 500)

    app = Starlette(routes=routes, exception_handlers={OjsError: ojs_error, HTTPException: http_error,
                                                       Exception: crash})
    return OjsHeaders(app)


class OjsHeaders:
    """ASGI wrapper: `OJS-Version` and `X-Request-Id` on every response, errors of the server itself
    included (outside Starlette's own error middleware)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")[:200]
        request_id = given or str(uuid.uuid4())
        scope.setdefault("state", {})["request_id"] = request_id

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["OJS-Version"] = VERSION
                headers["X-Request-Id"] = request_id
            await send(message)

        await self.app(scope, receive, sending)
