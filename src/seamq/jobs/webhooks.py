"""Webhooks (`ext-webhooks`): a subscription sends the job events it names to a URL, each delivery
signed, retried with the spec's backoff and recorded, so a receiver that was down gets every event
once it is back (no I/O here: what a subscription is, what it matches, how a delivery is signed and
what its answer means).

A delivery is signed as the spec says: `X-OJS-Signature: sha256=HMAC-SHA256(secret, timestamp + "." +
body)`, with the timestamp in `X-OJS-Timestamp`. Its id (`X-OJS-Delivery-ID`) is made of the event's
and the subscription's, so every attempt of one delivery carries the same id, and a receiver that
keeps the ids it has handled sees each event once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from seamq import codec
from seamq.jobs.model import OjsError, invalid, iso, uuid7

PREFIX = "webhook."  # subscriptions: records every server follows
ROTATION = 86400  # seconds a rotated secret still signs beside the new one (the spec's 24 hours)
SCHEDULE = (30.0, 120.0, 600.0, 3600.0, 14400.0, 43200.0, 86400.0)  # seconds before attempts 2 to 8 (the spec's)
TIMEOUT = 30.0  # seconds a receiver has to answer
USER_AGENT = "seamq-OJS-Webhook/1.0"
EVENT = re.compile(r"^(\*|[a-z][a-z_]*(\.([a-z][a-z_]*|\*))*)$")
FIELDS = {"url", "events", "active", "secret", "metadata", "filter"}
MOST_BYTES = 16 * 1024  # a subscription, which every server keeps in memory


def key(sub_id: str) -> str:
    return f"{PREFIX}{sub_id}"


def created(body: Any, now: datetime) -> tuple[dict[str, Any], str | None]:
    """A new subscription's record, and its secret when this server made it (said once, at creation)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object: {\"url\": ..., \"events\": [...]}")
    made = None if body.get("secret") is not None else f"whsec_{secrets.token_urlsafe(32)}"
    sub_id = f"sub_{uuid7()}"
    record = {"_key": key(sub_id), "_kind": "webhook", "id": sub_id, "active": True, "created_at": iso(now),
              **_checked({"secret": made, **body}, require=True)}
    return _sized(record), made


def updated(record: dict[str, Any], body: Any, now: datetime) -> dict[str, Any]:
    if not isinstance(body, dict) or not body:
        raise invalid("the request body must be a JSON object with the fields to change")
    return _sized({**record, **_checked(body, require=False), "updated_at": iso(now)})


def _sized(record: dict[str, Any]) -> dict[str, Any]:
    if len(codec.dumps(record)) > MOST_BYTES:
        raise invalid(f"a subscription holds at most {MOST_BYTES} bytes (its url, events, filter and metadata)")
    return record


def _checked(body: dict[str, Any], *, require: bool) -> dict[str, Any]:
    unknown = set(body) - FIELDS
    if unknown:
        raise invalid(f"a subscription has no field {sorted(unknown)[0]!r} (it has {', '.join(sorted(FIELDS))})")
    out: dict[str, Any] = {}
    if require or "url" in body:
        url = body.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2048:
            raise invalid("url must be an http or https URL")
        out["url"] = url
    if require or "events" in body:
        events = body.get("events")
        if not isinstance(events, list) or not events or not all(isinstance(e, str) and EVENT.match(e) for e in events):
            raise invalid("events must be a non-empty list of event types (job.completed, job.*, *)")
        out["events"] = list(dict.fromkeys(events))
    if "active" in body:
        if not isinstance(body["active"], bool):
            raise invalid("active must be true or false")
        out["active"] = body["active"]
    if body.get("secret") is not None:
        if not isinstance(body["secret"], str) or len(body["secret"]) < 16:
            raise invalid("secret must be a string of at least 16 characters")
        out["_secret"] = body["secret"]
    for name in ("metadata", "filter"):
        if body.get(name) is not None and not isinstance(body[name], dict):
            raise invalid(f"{name} must be an object")
    if "metadata" in body:
        out["metadata"] = body["metadata"]
    if "filter" in body:
        out["filter"] = _filter(body["filter"])
    return out


def _filter(given: dict[str, Any] | None) -> dict[str, Any] | None:
    if given is None:
        return None
    for name in given:
        if name not in ("queues", "job_types") or not isinstance(given[name], list) or \
                not all(isinstance(v, str) for v in given[name]):
            raise invalid("filter holds queues and job_types, each a list of names")
    return given


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A subscription as the API shows it: never its secret."""
    return {k: v for k, v in record.items() if not k.startswith("_")}


def matches(record: dict[str, Any], event: dict[str, Any]) -> bool:
    if not record.get("active", True):
        return False
    kind = event["type"]
    if not any(want == "*" or want == kind or (want.endswith(".*") and kind.startswith(want[:-1]))
               for want in record["events"]):
        return False
    found = record.get("filter") or {}
    data = event.get("data") or {}
    return (not found.get("queues") or data.get("queue") in found["queues"]) and \
        (not found.get("job_types") or data.get("job_type") in found["job_types"])


def delivery_id(sub_id: str, event_id: str) -> str:
    return "del_" + hashlib.sha256(f"{sub_id}/{event_id}".encode()).hexdigest()[:32]


def signature(secret: str, timestamp: int, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def headers(record: dict[str, Any], event: dict[str, Any], delivery: str, timestamp: int, body: bytes) -> dict[str, str]:
    """A delivery's headers; signed with the current secret and, for ROTATION seconds after a rotation,
    also with the one before (`sha256=new,sha256=old`: a receiver not yet given the new one still verifies)."""
    secrets_now = [record["_secret"], *([record["_old_secret"]] if record.get("_old_until", 0) > timestamp else [])]
    return {"Content-Type": "application/json", "User-Agent": USER_AGENT, "X-OJS-Event-Type": event["type"],
            "X-OJS-Delivery-ID": delivery, "X-OJS-Subscription-ID": record["id"], "X-OJS-Timestamp": str(timestamp),
            "X-OJS-Signature": ",".join(signature(secret, timestamp, body) for secret in secrets_now)}


def rotated(record: dict[str, Any], body: Any, now: datetime) -> tuple[dict[str, Any], str]:
    """The subscription with a new secret (the body's, else one made here) and the old one kept for
    ROTATION seconds; the new secret, to be said once."""
    given = body.get("secret") if isinstance(body, dict) else None
    if given is not None and (not isinstance(given, str) or len(given) < 16):
        raise invalid("secret must be a string of at least 16 characters (or leave it out: one is made)")
    secret = given or f"whsec_{secrets.token_urlsafe(32)}"
    return {**record, "_secret": secret, "_old_secret": record["_secret"], "_old_until": int(now.timestamp()) + ROTATION,
            "secret_rotated_at": iso(now)}, secret


def ping(record: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The synthetic event `POST .../test` sends (the spec's `webhook.test`)."""
    return {"specversion": "1.0", "id": f"evt_{uuid7()}", "type": "webhook.test", "source": "ojs://seamq",
            "time": iso(now), "datacontenttype": "application/json", "data": {"subscription_id": record["id"]}}


def outcome(status: int | None) -> str:
    """`delivered` (2xx); `retry` (no answer, 429, 5xx); `dead` (any other 4xx: asking again changes
    nothing). Redirects are followed (3 at most) before an answer is read."""
    if status is not None and 200 <= status < 300:
        return "delivered"
    if status is None or status == 429 or status >= 500:
        return "retry"
    return "dead"


def retry_in(attempt: int, schedule: tuple[float, ...] = SCHEDULE) -> float | None:
    """Seconds before the attempt after `attempt` (the first is 1); None when none is left."""
    return schedule[attempt - 1] if attempt <= len(schedule) else None


def not_found(sub_id: str) -> OjsError:
    return OjsError(404, "not_found", f"no webhook subscription {sub_id}")
