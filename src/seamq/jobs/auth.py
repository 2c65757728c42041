"""Who may call the job server: bearer tokens from settings (`SEAMQ_JOBS__TOKENS` may do anything,
`SEAMQ_JOBS__READ_TOKENS` only read), checked before any route runs.

With no token configured every caller is let in, and `seamq jobs serve` then
refuses to listen beyond loopback unless told `--no-auth`. Open to all, so
probes and discovery work: `/ojs/v1/health`, `/ojs/manifest`, and the admin
UI's static files (its API calls are checked like any other). Refusals are the
OJS error body with the wire codes the SDKs know (`unauthenticated`, 401,
OJS-5000; `permission_denied`, 403, OJS-5001); a token is compared in constant
time and never echoed, logged or put in an error.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from seamq.jobs.api import answer
from seamq.jobs.model import OjsError

OPEN = ("/ojs/v1/health", "/ojs/manifest")
OPEN_PREFIX = "/ojs/admin/"  # the admin UI's files; the data they show comes from /ojs/v1/admin
READS = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Tokens:
    full: tuple[str, ...] = ()
    read: tuple[str, ...] = ()

    @classmethod
    def parse(cls, full: str | None, read: str | None) -> "Tokens":
        split = lambda text: tuple(t.strip() for t in (text or "").split(",") if t.strip())  # noqa: E731
        return cls(split(full), split(read))

    @property
    def required(self) -> bool:
        return bool(self.full or self.read)

    def check(self, method: str, path: str, authorization: str) -> OjsError | None:
        """None when the request may go on, else the refusal."""
        if not self.required or path in OPEN or path.startswith(OPEN_PREFIX) or path == OPEN_PREFIX.rstrip("/"):
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return OjsError(401, "unauthenticated", "this server needs a token: send Authorization: Bearer <token>",
                            type="authentication_error")
        token = token.strip()
        if any(hmac.compare_digest(token.encode(), t.encode()) for t in self.full):
            return None
        if any(hmac.compare_digest(token.encode(), t.encode()) for t in self.read):
            if method in READS:
                return None
            return OjsError(403, "permission_denied", f"this token may only read; {method} {path} changes jobs",
                            type="authorization_error")
        return OjsError(401, "unauthenticated", "the token is not one this server knows", type="authentication_error")


class Guard:
    """ASGI wrapper: a request without a right token is answered here and never reaches a route."""

    def __init__(self, app, tokens: Tokens) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.tokens.required:
            headers = dict(scope.get("headers") or [])
            refused = self.tokens.check(scope["method"], scope["path"],
                                        headers.get(b"authorization", b"").decode("latin-1"))
            if refused is not None:
                response = answer(refused.body(), refused.status)
                if refused.status == 401:
                    response.headers["WWW-Authenticate"] = 'Bearer realm="seamq-jobs"'
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
