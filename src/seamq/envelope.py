"""The handler envelope (REQ-058) and handler outcomes.

`parse_message` turns what arrived from JetStream into an Envelope or a
`Rejected` with a precise reason, so a malformed message can be dead-lettered
and acknowledged instead of stalling its stream. No I/O here.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Generic, Mapping, TypeVar

from seamq import codec
from seamq.model import EventSubject, Header, SeamqError


class Reason(str, Enum):
    """Why a message was dead-lettered; stable strings for filters and alerts."""

    MISSING_MSG_ID = "missing_msg_id"
    INVALID_MSG_ID = "invalid_msg_id"
    INVALID_SUBJECT = "invalid_subject"
    INVALID_JSON = "invalid_json"
    INVALID_ENVELOPE = "invalid_envelope"
    NO_HANDLER = "no_handler"
    SCHEMA_MISMATCH = "schema_mismatch"
    HANDLER_REJECTED = "handler_rejected"  # 422
    MAX_DELIVER = "max_deliver"
    CONSUMER_ERROR = "consumer_error"  # preparing or handling it raised in seamq itself (a bug): logged too


P = TypeVar("P")  # the payload: a dict, or the EventModel a typed handler asks for (seamq.typed)


@dataclass(frozen=True, slots=True)
class Envelope(Generic[P]):
    message_id: uuid.UUID
    subject: str
    event_type: str
    event_version: int
    occurred_at: datetime
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    aggregate_type: str
    aggregate_id: str
    payload: P
    replay_attempt: int = 0
    # JetStream's delivery count: 1 on the first delivery, more after a failure,
    # a timeout or a crash (the side effects of an earlier attempt may exist).
    delivery_attempt: int = 1
    # True when this call repeats one made for the same delivery whose
    # transaction was rolled back: the consumer redoes a lane with a savepoint
    # per message when another handler in it failed (in-process handlers only).
    rerun: bool = False
    # A delayed event's time (outbox.add(..., deliver_at=)): it was not published before.
    deliver_at: datetime | None = None
    # The payload as it came, when it came as UTF-8 JSON: `body()` sends it as it is instead of
    # encoding the decoded object again (HTTP mode's largest cost after the request itself).
    payload_json: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def context(self) -> str:
        return self.subject.split(".", 1)[0]

    @property
    def aggregate(self) -> str:
        """What the consumer keeps in order: one aggregate's messages run in stream order."""
        return f"{self.aggregate_type}/{self.aggregate_id}"

    def body(self) -> bytes:
        """The SDS-047 §12 request body as JSON bytes, the payload spliced in as its producer encoded it."""
        fields = self.to_json()
        if self.payload_json is None:
            return codec.dumps(fields)
        del fields["payload"]
        return codec.dumps(fields)[:-1] + b',"payload":' + self.payload_json + b"}"

    def to_json(self) -> dict[str, Any]:
        """The SDS-047 §12 request body."""
        return {
            "message_id": str(self.message_id),
            "subject": self.subject,
            "event_type": self.event_type,
            "event_version": self.event_version,
            "occurred_at": self.occurred_at.isoformat(),
            "correlation_id": str(self.correlation_id) if self.correlation_id else None,
            "causation_id": str(self.causation_id) if self.causation_id else None,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "payload": self.payload,
            "delivery_attempt": self.delivery_attempt,
            "deliver_at": self.deliver_at.isoformat() if self.deliver_at else None,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Envelope[dict[str, Any]]":
        """Parse a §12 body; raises ValueError naming the bad field."""
        missing = [f for f in _REQUIRED if body.get(f) in (None, "")]
        if missing:
            raise ValueError(f"missing fields: {', '.join(missing)}")
        subject = EventSubject.parse(body["subject"])
        if (subject.name, subject.version) != (body["event_type"], body["event_version"]):
            raise ValueError("event_type/event_version disagree with subject")
        if not isinstance(body["payload"], dict):
            raise ValueError("payload must be a JSON object")
        return Envelope(
            message_id=_uuid(body["message_id"], "message_id"),
            subject=str(subject), event_type=subject.name, event_version=subject.version,
            occurred_at=_time(body["occurred_at"]),
            correlation_id=_optional_uuid(body.get("correlation_id"), "correlation_id"),
            causation_id=_optional_uuid(body.get("causation_id"), "causation_id"),
            aggregate_type=str(body["aggregate_type"]), aggregate_id=str(body["aggregate_id"]),
            payload=body["payload"],
            delivery_attempt=_int(body.get("delivery_attempt", 1), "delivery_attempt"),
            deliver_at=_time(body["deliver_at"], "deliver_at") if body.get("deliver_at") else None,
        )


_REQUIRED = ("message_id", "subject", "event_type", "event_version", "occurred_at", "aggregate_type",
             "aggregate_id", "payload")


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that cannot be handled, ever: it goes to the DLQ and is ACKed."""

    reason: Reason
    detail: str
    message_id: uuid.UUID | None = None  # known when the id itself was fine


def _uuid(value: Any, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a UUID") from None


def _optional_uuid(value: Any, name: str) -> uuid.UUID | None:
    return None if value in (None, "") else _uuid(value, name)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} {value!r} is not an integer")
    return value


def _time(value: Any, name: str = "occurred_at") -> datetime:
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name} {str(value)[:100]!r} is not an ISO-8601 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def parse_message(subject: str, headers: Mapping[str, str] | None, data: bytes,
                  delivery_attempt: int = 1) -> Envelope[dict[str, Any]] | Rejected:
    """Envelope from a JetStream message (subject, headers, JSON payload).

    Whatever the bytes, this returns: hostile input is a Rejected, never an exception.
    """
    headers = headers or {}
    raw_id = headers.get(Header.REPLAY_MESSAGE_ID) or headers.get(Header.MSG_ID)
    if not raw_id:
        return Rejected(Reason.MISSING_MSG_ID, "no Nats-Msg-Id header")
    try:
        message_id = uuid.UUID(raw_id)
    except ValueError:
        return Rejected(Reason.INVALID_MSG_ID, f"Nats-Msg-Id {raw_id[:100]!r} is not a UUID")
    try:
        parsed = EventSubject.parse(subject)
    except SeamqError as exc:
        return Rejected(Reason.INVALID_SUBJECT, exc.message, message_id)
    try:
        payload, payload_json = _load(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejected(Reason.INVALID_JSON, f"payload is not JSON: {exc}", message_id)
    except RecursionError:
        return Rejected(Reason.INVALID_JSON, "payload is nested too deeply to parse", message_id)
    if not isinstance(payload, dict):
        return Rejected(Reason.INVALID_JSON, f"payload must be a JSON object, got {type(payload).__name__}",
                        message_id)
    missing = [h for h in (Header.AGGREGATE_TYPE, Header.AGGREGATE_ID, Header.OCCURRED_AT) if not headers.get(h)]
    if missing:
        return Rejected(Reason.INVALID_ENVELOPE, f"missing headers: {', '.join(missing)}", message_id)
    declared = (headers.get(Header.EVENT_TYPE, parsed.name), headers.get(Header.EVENT_VERSION, str(parsed.version)))
    if declared != (parsed.name, str(parsed.version)):
        return Rejected(Reason.INVALID_ENVELOPE, f"headers say {declared[0]}.v{declared[1]}, subject says "
                        f"{parsed.name}.v{parsed.version}", message_id)
    try:
        return Envelope(
            message_id=message_id, subject=str(parsed), event_type=parsed.name, event_version=parsed.version,
            occurred_at=_time(headers[Header.OCCURRED_AT]),
            correlation_id=_optional_uuid(headers.get(Header.CORRELATION_ID), "correlation_id"),
            causation_id=_optional_uuid(headers.get(Header.CAUSATION_ID), "causation_id"),
            aggregate_type=headers[Header.AGGREGATE_TYPE], aggregate_id=headers[Header.AGGREGATE_ID],
            payload=payload, replay_attempt=int(headers.get(Header.REPLAY_ATTEMPT, "0") or 0),
            delivery_attempt=delivery_attempt,
            deliver_at=_time(headers[Header.DELIVER_AT], "deliver_at") if headers.get(Header.DELIVER_AT) else None,
            payload_json=payload_json,
        )
    except ValueError as exc:
        return Rejected(Reason.INVALID_ENVELOPE, str(exc), message_id)


def _load(data: bytes | str) -> tuple[Any, bytes | None]:
    """The payload, and its bytes when they may be sent on as they are: strict UTF-8 without a BOM,
    decoded once. Other bytes json.loads takes (UTF-16 or 32, a BOM, surrogates: it decodes with
    surrogatepass) are loaded as before and encoded again when sent."""
    if isinstance(data, bytes) and json.detect_encoding(data) == "utf-8":
        try:
            data.decode()  # strict UTF-8, or not sendable as it came
        except UnicodeDecodeError:
            return json.loads(data), None
        return codec.loads(data, strict=False), data
    return json.loads(data), None


class Outcome(str, Enum):
    OK = "ok"  # 200
    ALREADY_PROCESSED = "already_processed"  # 409
    POISON = "poison"  # 422
    RETRY = "retry"  # 5xx, timeout, connection error
    BUSY = "busy"  # 423: the service is handling this message in another call now; not an attempt


@dataclass(frozen=True, slots=True)
class HandlerResult:
    outcome: Outcome
    detail: str | None = None
    reason: "Reason | None" = None  # for POISON: why, when not "the handler said 422"

    @property
    def done(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.ALREADY_PROCESSED)

    @classmethod
    def timed_out(cls, seconds: float) -> "HandlerResult":
        """A handler that overran its limit: like a 5xx, tried again later."""
        return cls(Outcome.RETRY, f"handler timed out after {seconds:g}s")


class Poison(Exception):
    """Raise from a handler: this message can never succeed (422). It goes to the DLQ."""


class AlreadyProcessed(Exception):
    """Raise from a handler: this message's effect already happened (409)."""


