"""HMAC-SHA256 request signing, so handler services can reject callers that are not us.

Header `Seamq-Signature: t=<unix seconds>,v1=<hex>` where the hex digest is
HMAC-SHA256(secret, f"{t}.{body}"). The timestamp bounds replays of a
captured request to `tolerance` seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from seamq.model import Header


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def verify(secret: str, body: bytes, header: str | None, tolerance: float = 300) -> str | None:
    """None when valid, else why not."""
    if not header:
        return f"missing {Header.SIGNATURE} header"
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        t = int(parts["t"])
        given = parts["v1"]
    except (ValueError, KeyError):
        return f"malformed {Header.SIGNATURE} header"
    if abs(time.time() - t) > tolerance:
        return "signature timestamp outside tolerance"
    expected = sign(secret, body, t).split("v1=", 1)[1]
    if not hmac.compare_digest(expected, given):
        return "signature mismatch"
    return None
