"""The console's web application: pages rendered on the server (Jinja2), live parts by htmx
(vendored, `static/`), no JavaScript build.

Every page goes through `page()`: it reads the session, sends a stranger to the sign-in page,
checks the CSRF token of every POST and the role of every action before the handler runs, and
turns an error a person can act on into a page that says so (never a traceback). The rules of
what may be done live in seamq.dlq_desk and the job server; the pages only show and ask.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from seamq.console.auth import COOKIE, Session, Signer, Users, csrf_ok
from seamq.jobs.client import JobsError
from seamq.model import ErrorCode, SeamqError, describe
from seamq.observability import log
from seamq.redact import redact

AWAY = (ErrorCode.BROKER_UNAVAILABLE, ErrorCode.DATABASE_UNAVAILABLE)  # a service's absence: 503, not the request's fault
MAX_FORM = 1024 * 1024  # bytes: an edited message body fits; more is refused, not read
HEADERS = {  # pages are the operator's own: not framed, not cached, no script but ours
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


@dataclass
class Ctx:
    request: Request
    session: Session
    form: dict[str, list[str]] = field(default_factory=dict)

    def one(self, name: str, default: str = "") -> str:
        values = self.form.get(name) or self.request.query_params.getlist(name)
        return values[0] if values else default

    def many(self, name: str) -> list[str]:
        return self.form.get(name) or self.request.query_params.getlist(name)

    @property
    def actor(self) -> str:
        return f"console:{self.session.user or 'local'}"


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Sessions(Protocol):
    """Where the users' session generations live (seamq.pg.console_sessions.PgSessions)."""

    async def generation(self, user: str) -> int: ...

    async def end(self, user: str) -> int: ...


Audit = Callable[..., Awaitable[None]]  # audit(actor, action, **detail): a refused request, recorded


class Console:
    def __init__(self, users: Users, signer: Signer, templates: Environment, sessions: Sessions,
                 audit: Audit) -> None:
        self.users, self.signer, self.templates = users, signer, templates
        self.sessions, self.audit = sessions, audit

    def render(self, name: str, ctx: Ctx, status: int = 200, **values) -> HTMLResponse:
        html = self.templates.get_template(name).render(session=ctx.session, request=ctx.request,
                                                       open_console=not self.users.required, **values)
        return HTMLResponse(html, status)

    def page(self, handler: Callable[[Ctx], Awaitable[Response]], *, action: bool = False):
        async def endpoint(request: Request) -> Response:
            session = self.signer.load(request.cookies.get(COOKIE))
            if session is not None and session.signed_in and self.users.required:
                try:
                    if not await self._still_on(session):
                        log.info("console_session_refused", user=session.user[:64], reason="ended")
                        session = None
                except Exception as exc:  # cannot tell: nothing is shown to an unverified session
                    return self._finish(self._failed(Ctx(request, self.signer.new("", "")), exc), None)
            fresh = session is None
            if fresh:  # a stranger gets a session to carry a CSRF token; on an open console, as "local", an admin
                session = self.signer.new(*(("", "") if self.users.required else ("local", "admin")))
            if self.users.required and not session.signed_in and handler != self.login:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return self._finish(RedirectResponse(f"/login?next={quote(target)}", 303), session if fresh else None)
            ctx = Ctx(request, session)
            try:
                if request.method == "POST":
                    ctx.form = await _form(request)
                    if fresh or not csrf_ok(session, ctx.one("csrf") or request.headers.get("x-csrf-token")):
                        raise Refused(403, "this request does not carry the console's CSRF token: reload the page "
                                           "and try again")
                    if action and not session.may_act:
                        raise Refused(403, f"{session.user} may only look (role {session.role}); this is an action")
                response = await handler(ctx)
            except Refused as exc:
                await self._record_refusal(ctx, exc)
                response = self.render("error.html", ctx, exc.status, message=exc.message, code="refused")
            except (SeamqError, JobsError) as exc:
                coded = exc.coded() if isinstance(exc, JobsError) else exc
                status = exc.status if isinstance(exc, JobsError) and exc.status >= 400 else \
                    404 if coded.code is ErrorCode.NOT_FOUND else 503 if coded.code in AWAY else 400
                response = self.render("error.html", ctx, status, message=redact(coded.message), code=coded.code.value)
            except Exception as exc:
                response = self._failed(ctx, exc)
            return self._finish(response, session if fresh else None)

        return endpoint

    async def _still_on(self, session: Session) -> bool:
        """A signed-in session opens pages while its user is configured with the same role and
        password, and has not signed out since (on any console sharing the database)."""
        known = self.users.passwords.get(session.user)
        if known is None or known[1] != session.role or \
                not hmac.compare_digest(self.signer.fingerprint(session.user, known[0]), session.password):
            return False
        return await self.sessions.generation(session.user) == session.generation

    async def _record_refusal(self, ctx: Ctx, exc: Refused) -> None:
        """A refused request (a viewer's action, a POST without the CSRF token, a form of the wrong
        shape) in the log and in the audit (operator_actions), with who and what."""
        what = dict(method=ctx.request.method, path=ctx.request.url.path[:200], status=exc.status, reason=exc.message)
        actor = ctx.actor if ctx.session.signed_in or not self.users.required else "console:(not signed in)"
        log.warning("console_refused", actor=actor, **what)
        if ctx.request.method != "POST":
            return
        try:
            await self.audit(actor, "console.refused", **what)
        except Exception as audit_failed:  # the refusal stands; the log above has it
            log.error("console_refusal_not_audited", error=redact(describe(audit_failed)))

    def _failed(self, ctx: Ctx, exc: Exception) -> Response:
        what = redact(describe(exc))
        away = _away(exc, ctx.request.url.path)
        if away:  # not the console's fault, nor the request's
            log.warning("console_backend_unavailable", path=ctx.request.url.path, service=away, error=what)
            return self.render("error.html", ctx, 503, code="UNAVAILABLE", message=f"{away} does not answer: {what}")
        log.error("console_failed", path=ctx.request.url.path, error=what, exc_info=True)  # a bug
        return self.render("error.html", ctx, 500, code="INTERNAL",
                           message="the console failed on this request; its log says why")

    def _finish(self, response: Response, new_session: Session | None) -> Response:
        response.headers.update(HEADERS)
        if new_session is not None:
            self.set_cookie(response, new_session)
        return response

    def set_cookie(self, response: Response, session: Session) -> None:
        response.set_cookie(COOKIE, self.signer.dump(session), max_age=int(self.signer.seconds), httponly=True,
                            samesite="strict", path="/")

    async def login(self, ctx: Ctx) -> Response:
        target = ctx.one("next", "/")
        # Only a path of this console: "//host" and "/\\host" are other sites to a browser.
        target = target if target.startswith("/") and target[1:2] not in ("/", "\\") else "/"
        if ctx.request.method == "GET":  # signed in already: the form signs in as someone else
            return self.render("login.html", ctx, next=target)
        name, password = ctx.one("username"), ctx.one("password")
        role = self.users.check(name, password)
        if role is None:
            log.warning("console_sign_in_refused", user=name[:64])
            return self.render("login.html", ctx, 401, next=target, failed=True)
        log.info("console_signed_in", user=name, role=role)
        response = RedirectResponse(target, 303)
        self.set_cookie(response, self.signer.new(name, role, await self.sessions.generation(name), password))
        return response

    async def logout(self, ctx: Ctx) -> Response:
        if ctx.session.signed_in and self.users.required:
            await self.sessions.end(ctx.session.user)  # every session of this user, on every console
        log.info("console_signed_out", user=ctx.session.user)
        response = RedirectResponse("/login" if self.users.required else "/", 303)
        response.delete_cookie(COOKIE, path="/")
        return response


def _away(exc: Exception, path: str) -> str | None:
    """Which service the console reads is away or not answering, with the setting that points at
    it; None for an error that is no service's absence (a bug)."""
    import aiohttp

    from seamq.doors import away

    return away(exc, job_server=isinstance(exc, aiohttp.ClientError) or (
        path.startswith("/jobs") and isinstance(exc, (OSError, TimeoutError))))


async def _form(request: Request) -> dict[str, list[str]]:
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind not in ("application/x-www-form-urlencoded", ""):
        raise Refused(415, f"the console takes forms (application/x-www-form-urlencoded), not {kind[:80]}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Refused(413, f"a form of more than {MAX_FORM} bytes is refused")
    try:
        return parse_qs(body.decode(), keep_blank_values=True, max_num_fields=5000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(400, f"the form cannot be read: {exc}") from None


def templates() -> Environment:
    env = Environment(loader=PackageLoader("seamq.console", "templates"), autoescape=select_autoescape(default=True))
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str)
    env.filters["when"] = lambda v: str(v).replace("T", " ")[:19] if v else "-"
    env.filters["ms"] = lambda v: f"{v * 1000:.1f}" if v is not None else "-"
    env.filters["rate"] = lambda v: f"{v:.1f}" if v else "0"
    env.filters["known"] = lambda v: "unknown" if v is None else v
    env.filters["q"] = lambda v: quote(str(v), safe="")
    env.filters["epoch"] = lambda v: datetime.fromtimestamp(v, timezone.utc).strftime("%H:%M:%S UTC")
    env.filters["redacted"] = lambda v: redact(str(v))  # a URL with a password or a token in it
    return env


def build(console: Console, routes: list[Route]) -> Starlette:
    async def nowhere(ctx: Ctx) -> Response:
        raise SeamqError(ErrorCode.NOT_FOUND, f"the console has no page {ctx.request.url.path[:200]}")

    return Starlette(routes=[
        Route("/login", console.page(console.login), methods=["GET", "POST"]),
        Route("/logout", console.page(console.logout), methods=["POST"]),
        *routes,
        Mount("/static", StaticFiles(packages=[("seamq.console", "static")]), name="static"),
        Route("/{path:path}", console.page(nowhere), methods=["GET", "POST"]),  # any other path: a coded page
    ])
