"""Secrets never printed: one place that scrubs them from any text seamq outputs.

Errors of drivers and libraries quote what they were given (libpq quotes a
DSN it cannot parse, a pool logs its connection errors), so masking our own
fields is not enough. Every way out (logs, `error[CODE]` lines, tracebacks)
goes through `redact`, which masks passwords in URLs and conninfo strings by
their shape, and every secret the settings hold by its value, including the
pieces of one that contains spaces (a parser may quote just a piece).
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

MASK = "***"

_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*:?//[^\s:/@]*:)([^\s@/]+)@")
_CONNINFO_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)", re.IGNORECASE)
_MIN_PIECE = 3  # shorter pieces of a secret are too common to mask

_known: set[str] = set()


def register(*secrets: str | None) -> None:
    """Remember secret values (settings do this as they load) so that no output shows them."""
    for secret in secrets:
        if not secret:
            continue
        for form in {secret, quote(secret, safe=""), unquote(secret)}:
            _known.add(form)
            _known.update(piece for piece in form.split() if len(piece) >= _MIN_PIECE)


def redact(text: str) -> str:
    if not text:
        return text
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _CONNINFO_PASSWORD.sub(rf"\1{MASK}", text)
    for secret in sorted(_known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def url_password(url: str) -> str | None:
    """The password in a URL's userinfo (`scheme://user:password@host`), if any."""
    match = re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:?//([^/?#]*)@", url.strip())
    if match and ":" in match.group(1):
        return match.group(1).split(":", 1)[1]
    return None


def conninfo_password(dsn: str) -> str | None:
    """The password of a libpq key=value string, if any."""
    match = _CONNINFO_PASSWORD.search(dsn)
    return match.group(2).strip("'") if match else None
