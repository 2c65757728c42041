"""Who may use the console, and proof that a change came from its own pages.

- Users from settings (`SEAMQ_CONSOLE__USERS="alice:pw:admin,bob:pw:viewer"`). With none, the console
  is open to whoever reaches it, which `seamq console` allows on loopback only (and as the one
  user "local", an admin).
- A sign-in is a cookie signed with HMAC-SHA256 (name, role, CSRF token, expiry, the user's session
  generation and a keyed fingerprint of their password), HttpOnly and SameSite=Strict. It opens
  pages while its user is still configured with the same password and has not signed out since:
  signing out moves the user's generation on in PostgreSQL (seamq.pg.console_sessions), which every
  console sharing the database reads on each request.
- Every POST carries the session's CSRF token (a form field, or the `X-CSRF-Token` header htmx
  sends); without it, or with another, it is refused with 403 before any handler runs.
- A viewer sees no action and is refused one with 403 if it sends one anyway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from seamq.model import ErrorCode, SeamqError
from seamq.settings import console_users

COOKIE = "seamq_console"
ROLES = ("admin", "viewer")


@dataclass(frozen=True)
class Session:
    user: str
    role: str
    csrf: str
    expires: float
    generation: int = 0  # the user's session generation at sign-in (seamq.pg.console_sessions)
    password: str = ""  # a keyed fingerprint of the password signed in with: a changed one ends it

    @property
    def may_act(self) -> bool:
        return self.role == "admin"

    @property
    def signed_in(self) -> bool:
        return bool(self.user)


@dataclass(frozen=True)
class Users:
    passwords: dict[str, tuple[str, str]]  # name -> (password, role)

    @classmethod
    def parse(cls, text: str | None) -> "Users":
        out: dict[str, tuple[str, str]] = {}
        for name, password, role in console_users(text):
            if not name or not password or role not in ROLES:
                raise SeamqError(ErrorCode.INVALID_CONFIG, f"console.users: an entry for {name or '?'!r} is not "
                                                           "name:password:role with role admin or viewer")
            out[name] = (password, role)
        return cls(out)

    @property
    def required(self) -> bool:
        return bool(self.passwords)

    def check(self, name: str, password: str) -> str | None:
        """The user's role when the password is theirs (compared in constant time), else None."""
        known = self.passwords.get(name)
        given = password.encode()
        if known is None:
            hmac.compare_digest(given, given)  # the same time whether the name exists or not
            return None
        return known[1] if hmac.compare_digest(given, known[0].encode()) else None


class Signer:
    def __init__(self, secret: str | None, hours: float) -> None:
        self.key = (secret or secrets.token_urlsafe(32)).encode()
        self.seconds = hours * 3600

    def new(self, user: str, role: str, generation: int = 0, password: str = "") -> Session:
        return Session(user, role, secrets.token_urlsafe(24), time.time() + self.seconds, generation,
                       self.fingerprint(user, password) if password else "")

    def fingerprint(self, user: str, password: str) -> str:
        """The password, keyed and cut: the cookie is readable, so it must not carry a plain hash."""
        return hmac.new(self.key, f"{user}\0{password}".encode(), hashlib.sha256).hexdigest()[:32]

    def dump(self, session: Session) -> str:
        fields = [session.user, session.role, session.csrf, session.expires, session.generation, session.password]
        body = base64.urlsafe_b64encode(json.dumps(fields).encode())
        body = body.rstrip(b"=")  # a cookie value without characters that need quoting
        return f"{body.decode()}.{self._mac(body)}"

    def load(self, cookie: str | None) -> Session | None:
        """The session a cookie holds, if this console signed it and it has not expired."""
        body, _, mac = (cookie or "").encode().partition(b".")
        if not body or not hmac.compare_digest(mac.decode(errors="replace"), self._mac(body)):
            return None
        try:
            user, role, csrf, expires, generation, password = json.loads(
                base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4)))
        except (ValueError, TypeError):
            return None
        if not isinstance(expires, (int, float)) or expires < time.time() or role not in (*ROLES, "") \
                or not isinstance(generation, int):
            return None
        return Session(str(user), str(role), str(csrf), float(expires), generation, str(password))

    def _mac(self, body: bytes) -> str:
        return hmac.new(self.key, body, hashlib.sha256).hexdigest()


def csrf_ok(session: Session, given: str | None) -> bool:
    return bool(given and hmac.compare_digest(session.csrf.encode(), given.encode()))
