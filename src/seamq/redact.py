"""Secrets never printed: one place that scrubs them from any text seamq outputs.

Errors of drivers and libraries quote what they were given (libpq quotes a
DSN it cannot parse, a pool logs its connection errors), so masking our own
fields is not enough. Every way out (logs, `error[CODE]` lines, tracebacks)
goes through `redact`, which masks passwords in URLs, conninfo strings and
Authorization headers by their shape, and every secret the settings hold by its
value, including the pieces of one that contains spaces (a parser may quote just
a piece).

A value is masked where it stands as a whole token, never inside another word:
masking every occurrence of a one-letter password turned "expected" into
"ex***ected". A secret shorter than MIN_SECRET is refused as settings load: it is
too short to be a secret, and too common a string to mask.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

MASK = "***"

_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*:?//[^\s:/@]*:)([^\s@/]+)@")
_CONNINFO_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)", re.IGNORECASE)
_AUTHORIZATION = re.compile(r"(\b(?:Proxy-)?Authorization\s*[:=]\s*(?:(?:Bearer|Basic|Token)\s+)?)([^\s,;'\"]+)",
                            re.IGNORECASE)
MIN_SECRET = 8  # NIST SP 800-63B's floor for a password a person chooses
_MIN_PIECE = 3  # shorter pieces of a secret with spaces are too common to mask

_known: set[str] = set()
_pattern: re.Pattern[str] | None = None


class ShortSecret(ValueError):
    """A secret too short to be one; settings report it under the key that holds it."""


def register(*secrets: str | None) -> None:
    """Remember secret values (settings do this as they load) so that no output shows them.
    Raises ShortSecret for one shorter than MIN_SECRET."""
    global _pattern
    for secret in secrets:
        if not secret:
            continue
        if len(secret) < MIN_SECRET:
            raise ShortSecret(f"a secret must be at least {MIN_SECRET} characters long (this one has "
                              f"{len(secret)}): a shorter one is guessed, and its text is too common to keep out "
                              "of logs and errors without masking ordinary words")
        for form in {secret, quote(secret, safe=""), unquote(secret)}:
            _known.add(form)
            _known.update(piece for piece in form.split() if len(piece) >= _MIN_PIECE)
        _pattern = None


def _known_values() -> re.Pattern[str] | None:
    """One pattern for every known value, longest first, each only as a whole token."""
    global _pattern
    if _pattern is None and _known:
        values = "|".join(re.escape(value) for value in sorted(_known, key=len, reverse=True))
        _pattern = re.compile(rf"(?<![A-Za-z0-9])(?:{values})(?![A-Za-z0-9])")
    return _pattern


def redact(text: str) -> str:
    if not text:
        return text
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _CONNINFO_PASSWORD.sub(rf"\1{MASK}", text)
    text = _AUTHORIZATION.sub(rf"\1{MASK}", text)
    known = _known_values()
    return known.sub(MASK, text) if known else text


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
