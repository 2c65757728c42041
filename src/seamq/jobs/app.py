"""The OJS server's Starlette app: the core, extension and admin routes, the error handlers, and the
official admin UI's files when the operator points `--admin-ui` at a build of it."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from seamq.jobs import ext_routes, probe_routes, routes
from seamq.jobs.hook_routes import hook_routes
from seamq.jobs.fair_routes import fair_routes
from seamq.jobs.admin_routes import admin_routes
from seamq.jobs.api import FixedPaths, OjsHeaders, answer
from seamq.jobs.auth import Guard, Tokens
from seamq.jobs.console_routes import console_routes
from seamq.jobs.engine import Engine
from seamq.jobs.model import OjsError
from seamq.jobs.ports import Post
from seamq.nats.publisher import UNREACHABLE
from seamq.observability import log
from seamq.model import describe

ADMIN_UI_PATH = "/ojs/admin"


def build_app(engine: Engine, *, test_mode: bool = False, conformance_level: int = 4,
              admin_ui: Path | None = None, tokens: Tokens = Tokens(), post: Post | None = None) -> OjsHeaders:
    """`post`: how webhooks are sent, for a subscription's test ping (seamq.jobs.poster)."""
    async def reset(request: Request) -> Response:
        await engine.reset()
        return answer({"reset": True})

    table = [*routes.core(engine, conformance_level), *ext_routes.extensions(engine), *admin_routes(engine),
             *console_routes(engine), *probe_routes.probes(engine),
             *hook_routes(engine, post), *fair_routes(engine)]
    if test_mode:
        table.append(Route("/ojs/v1/admin/reset", reset, methods=["POST"]))
    if admin_ui is not None:
        table.extend(admin_ui_routes(admin_ui))

    async def ojs_error(request: Request, exc: OjsError) -> Response:
        said = answer(exc.body(getattr(request.state, "request_id", None)), exc.status)
        said.headers.update(exc.headers or {})
        return said

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        error = OjsError(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}")
        said = answer(error.body(), exc.status_code)
        if exc.status_code == 405:  # every method the path takes: Starlette names the first route's alone
            said.headers["Allow"] = ", ".join(sorted({method for route in table if isinstance(route, Route)
                                                      and route.path_regex.match(request.url.path)
                                                      for method in route.methods or ()}))
        return said

    async def unreachable(request: Request, exc: Exception) -> Response:
        """NATS away or slow (a node lost, an election): a client may try again, here or at another
        server; said as OJS's backend codes, logged without a traceback."""
        timeout = isinstance(exc, TimeoutError)  # nats-py's and asyncio's are both
        log.warning("ojs_backend_unavailable", path=request.url.path, error=describe(exc))
        error = OjsError(504, "backend_timeout", "NATS did not answer in time; try again") if timeout else \
            OjsError(503, "backend_unavailable", "NATS is unreachable; try again")
        return answer(error.body(getattr(request.state, "request_id", None)), error.status)

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("ojs_request_failed", path=request.url.path, error=describe(exc))
        return answer(OjsError(500, "backend_error", "internal error; see the server log").body(), 500)

    handlers = {OjsError: ojs_error, HTTPException: http_error, **{kind: unreachable for kind in UNREACHABLE},
                Exception: crash}
    app = Starlette(routes=table, exception_handlers=handlers)
    return OjsHeaders(Guard(FixedPaths(app, table, handlers), tokens))


def admin_ui_routes(folder: Path) -> list[Route]:
    """A single-page app under /ojs/admin/: a file of the build when the path names one (its assets
    are linked relatively, so from /ojs/admin/a/b they are asked for under a/), else index.html,
    whose router shows the page. Nothing outside the folder is ever served."""
    root = folder.resolve()

    async def redirect(request: Request) -> Response:
        return RedirectResponse(f"{ADMIN_UI_PATH}/")

    async def page(request: Request) -> Response:
        wanted = request.path_params.get("path", "")
        if "assets/" in wanted:
            wanted = "assets/" + wanted.rsplit("assets/", 1)[1]
        candidate = (root / wanted).resolve()
        if wanted and candidate.is_relative_to(root) and candidate.is_file():
            return FileResponse(candidate)
        return FileResponse(root / "index.html", headers={"Cache-Control": "no-cache"})

    return [Route(ADMIN_UI_PATH, redirect, methods=["GET"]),
            Route(ADMIN_UI_PATH + "/{path:path}", page, methods=["GET"])]
