"""The core model of SDS-047: events, subjects, headers, error codes and policies.

This module does no I/O. Everything here can be checked before a database or
a broker is touched, so a bad event fails in the caller's code with an error
code (POL-047-001/002) rather than as a constraint violation deep in a
transaction. The database CHECKs stay as the last line of defence.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping

from seamq.ids import uuid7

if TYPE_CHECKING:  # a typed payload (seamq.typed.EventModel) is a pydantic model
    from pydantic import BaseModel

# A subject token: lowercase snake case, starting with a letter. No dots,
# wildcards or whitespace can pass this, which is what keeps subjects routable.
NAME = r"[a-z][a-z0-9_]*"  # a context, event or consumer part: the one name rule
_TOKEN = re.compile(rf"^{NAME}$")
# An optional last token `.b{bucket}` routes the event to a partition (topology `partitions`).
_SUBJECT = re.compile(rf"^({NAME})\.event\.({NAME})\.v([1-9][0-9]*)(?:\.b(\d{{1,3}}))?$")
# ADR-032: a consumer is named `{target}__from_{source}`; the inbox, the DLQ lists and the KPIs read
# its contexts back from the name.
CONSUMER_SEPARATOR = "__from_"
CONSUMER_NAME = re.compile(rf"^({NAME}){CONSUMER_SEPARATOR}({NAME})$")


def is_name(value: object) -> bool:
    """A context, event or other subject token: lowercase snake_case, starting with a letter."""
    return isinstance(value, str) and bool(_TOKEN.match(value))

# Aggregates hash into this many buckets: outbox_events.bucket (pg/migrations/0001). The relay claims
# by bucket, and puts the bucket in the subject of a context whose consumers are partitioned.
BUCKETS = 128

# POL-047-002 allows this much clock skew, matching the SQL CHECK of §9.
CLOCK_SKEW = timedelta(minutes=1)


class ErrorCode(str, Enum):
    """Codes carried by seamq errors; the spec's names where it has one."""

    INVALID_OUTBOX = "INVALID_OUTBOX"  # POL-047-001
    FUTURE_EVENT = "FUTURE_EVENT"  # POL-047-002
    DUPLICATE_MESSAGE = "DUPLICATE_MESSAGE"  # POL-047-003
    INVALID_TIMESTAMP = "INVALID_TIMESTAMP"  # POL-047-004
    INVALID_SUBJECT = "INVALID_SUBJECT"
    INVALID_TOPOLOGY = "INVALID_TOPOLOGY"
    INVALID_CONFIG = "INVALID_CONFIG"
    DESTRUCTIVE_CHANGE = "DESTRUCTIVE_CHANGE"
    UNSUPPORTED_CONNECTION = "UNSUPPORTED_CONNECTION"
    NOT_IN_TRANSACTION = "NOT_IN_TRANSACTION"  # outbox.add outside the caller's transaction
    PORT_IN_USE = "PORT_IN_USE"  # a server's port is taken
    MIGRATION_FAILED = "MIGRATION_FAILED"
    SCHEMA_OUTDATED = "SCHEMA_OUTDATED"
    EMBEDDED_SERVICE = "EMBEDDED_SERVICE"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    INVALID_MANIFEST = "INVALID_MANIFEST"
    BREAKING_CHANGE = "BREAKING_CHANGE"
    REGISTRY_STALE = "REGISTRY_STALE"  # `registry check`: regenerate the module, or a change needs a new version
    NOT_FOUND = "NOT_FOUND"
    CONFIRMATION_NEEDED = "CONFIRMATION_NEEDED"  # a command that deletes or cancels many things waits for --yes
    INVALID_JOB = "INVALID_JOB"  # seamq.jobs.enqueue: a job the server would refuse
    INVALID_INPUT = "INVALID_INPUT"  # an operator's input (an edited message body, a console form) refused
    JOB_REFUSED = "JOB_REFUSED"  # the job server refused an operator's request (a job in the wrong state)
    BROKER_UNAVAILABLE = "BROKER_UNAVAILABLE"
    DATABASE_ERROR = "DATABASE_ERROR"
    PIPELINE_FAILED = "PIPELINE_FAILED"  # a Spark query failed again after its restarts
    INTERNAL = "INTERNAL"  # a bug: an unexpected exception, reported with its (redacted) traceback


ERROR_LIMIT = 500  # characters of an error kept in a log line, a record or an answer: any exception's text can be huge


def describe(exc: BaseException, limit: int = ERROR_LIMIT) -> str:
    """An exception for people and records: its class and its message, cut to `limit`."""
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:limit]


class SeamqError(Exception):
    """An error a person can act on: a stable code plus a message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


def validate_token(value: str, what: str) -> str:
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise SeamqError(
            ErrorCode.INVALID_SUBJECT,
            f"{what} {value!r} must be lowercase snake_case "
            "(a-z, 0-9, _; starting with a letter; no dots, wildcards or spaces)",
        )
    return value


@dataclass(frozen=True, slots=True)
class EventSubject:
    """`{context}.event.{snake_case_name}.v{n}` (REQ-057), optionally followed by `.b{bucket}`.

    The bucket is routing, not identity: str() is the event subject without it.
    """

    context: str
    name: str
    version: int

    def __post_init__(self) -> None:
        validate_token(self.context, "context")
        validate_token(self.name, "event type")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise SeamqError(
                ErrorCode.INVALID_SUBJECT, f"event version must be an integer >= 1, got {self.version!r}"
            )

    @classmethod
    def parse(cls, subject: str) -> "EventSubject":
        return _parse_subject(subject)

    def __str__(self) -> str:
        return f"{self.context}.event.{self.name}.v{self.version}"

    def routed(self, bucket: int) -> str:
        """The subject with its aggregate's bucket, for a partitioned context."""
        return f"{self}.b{bucket}"


@functools.lru_cache(maxsize=8192)  # a consumer sees few distinct subjects, parsed once per message
def _parse_subject(subject: str) -> EventSubject:
    match = _SUBJECT.match(subject or "")
    if not match or (match[4] and int(match[4]) >= BUCKETS):
        raise SeamqError(
            ErrorCode.INVALID_SUBJECT,
            f"subject {subject!r} is not of the form {{context}}.event.{{snake_case_name}}.v{{n}}"
            f"[.b{{bucket < {BUCKETS}}}]",
        )
    return EventSubject(match[1], match[2], int(match[3]))


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A message to publish: what the relay, a dead letter and a replay hand to a publisher."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    stream: str | None = None  # the stream that takes the subject, when known: it can be published in batches
    # Messages of one key (the relay's: an aggregate) are stored in the order given, or not at all: a
    # publisher stores none after one of its key that was not stored (seamq.nats.publisher).
    key: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class PubResult:
    """What became of one OutMessage."""

    ok: bool
    seq: int | None = None  # where the stream stored it (from a fast batch: at or before; seamq.nats.fast_batch)
    duplicate: bool = False  # JetStream had it already (same Nats-Msg-Id inside the duplicate window)
    error: str | None = None
    transport: bool = False  # the broker was unreachable or did not answer: not the message's fault
    held: bool = False  # not stored because an earlier message of its batch was not: send again, nothing counted


@dataclass(frozen=True, slots=True)
class Event:
    """A domain event as the caller writes it to the outbox.

    `context` names the bounded context that owns the event and so its stream
    (SEA_EVENTS for `sea`). The spec keeps one outbox per context database;
    carrying the context on the row lets one database serve several contexts
    too (see docs/architecture.md).
    """

    context: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: Mapping[str, Any] | BaseModel  # a dict, or a typed EventModel (seamq.typed)
    event_version: int = 1
    id: uuid.UUID = field(default_factory=uuid7)  # time-ordered: the outbox's indexes append (seamq.ids)
    occurred_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    correlation_id: uuid.UUID | None = None
    causation_id: uuid.UUID | None = None
    deliver_at: datetime | None = None  # not published before (the relay holds the row: migration 0004)

    @property
    def subject(self) -> EventSubject:
        return EventSubject(self.context, self.event_type, self.event_version)


def check_outbox_policies(event: Event, now: datetime | None = None) -> Event:
    """POL-047-001 and POL-047-002, plus the shape checks the relay relies on."""
    if event.id is None or not isinstance(event.id, uuid.UUID):
        raise SeamqError(ErrorCode.INVALID_OUTBOX, f"event id must be a UUID, got {event.id!r}")
    if not event.event_type:
        raise SeamqError(ErrorCode.INVALID_OUTBOX, "event_type is required")
    if not event.aggregate_type or not event.aggregate_id:
        raise SeamqError(ErrorCode.INVALID_OUTBOX, "aggregate_type and aggregate_id are required")
    if not isinstance(event.payload, Mapping):
        raise SeamqError(
            ErrorCode.INVALID_OUTBOX, f"payload must be a JSON object, got {type(event.payload).__name__}"
        )
    for name in ("correlation_id", "causation_id"):
        value = getattr(event, name)
        if value is not None and not isinstance(value, uuid.UUID):
            raise SeamqError(ErrorCode.INVALID_OUTBOX, f"{name} must be a UUID or None, got {value!r}")
    try:
        event.subject  # noqa: B018  # built for its checks
    except SeamqError as exc:
        raise SeamqError(ErrorCode.INVALID_OUTBOX, exc.message) from None
    occurred = event.occurred_at
    if occurred.tzinfo is None:
        raise SeamqError(ErrorCode.INVALID_OUTBOX, "occurred_at must be timezone-aware")
    if event.deliver_at is not None and (not isinstance(event.deliver_at, datetime) or event.deliver_at.tzinfo is None):
        raise SeamqError(ErrorCode.INVALID_OUTBOX, f"deliver_at must be a timezone-aware datetime, got {event.deliver_at!r}")
    now = now or datetime.now(timezone.utc)
    if occurred > now + CLOCK_SKEW:
        raise SeamqError(ErrorCode.FUTURE_EVENT, f"occurred_at {occurred.isoformat()} is in the future")
    return event


# Headers on the wire. The relay sets MSG_ID, the aggregate's and the ids' (message_headers); type
# and version travel in the subject, and a publisher that does send EVENT_TYPE/EVENT_VERSION must
# agree with it (envelope.parse_message checks).
class Header:
    MSG_ID = "Nats-Msg-Id"
    EVENT_TYPE = "Seamq-Event-Type"
    EVENT_VERSION = "Seamq-Event-Version"
    AGGREGATE_TYPE = "Seamq-Aggregate-Type"
    AGGREGATE_ID = "Seamq-Aggregate-Id"
    OCCURRED_AT = "Seamq-Occurred-At"
    DELIVER_AT = "Seamq-Deliver-At"  # a delayed event's time: its latency counts from there
    CORRELATION_ID = "Seamq-Correlation-Id"
    CAUSATION_ID = "Seamq-Causation-Id"
    TRACEPARENT = "traceparent"
    # On a message published again (seamq.republish): a copy keeps the original's id, the inbox key,
    # in REPLAY_MESSAGE_ID; a DLQ replay says its round; a replay or an edited copy (seamq.dlq_desk,
    # which names the original in EDIT_OF) is for one consumer, and the subject's others skip it.
    REPLAY_MESSAGE_ID = "Seamq-Message-Id"
    REPLAY_ATTEMPT = "Seamq-Replay-Attempt"
    REPLAY_CONSUMER = "Seamq-Replay-Consumer"
    EDIT_OF = "Seamq-Edit-Of"
    DLQ_REASON = "Seamq-Dlq-Reason"  # a dead letter's reason, for filters that do not parse bodies
    SIGNATURE = "Seamq-Signature"  # a handler request's HMAC (seamq.http.signing)
    CONSUMER = "Seamq-Consumer"  # a handler request's consumer: with the message id, what a service records


def message_headers(event: Event | Any, traceparent: str | None = None) -> dict[str, str]:
    """Headers for an Event, or any row with the same fields (the relay's OutboxRow)."""
    # Event type and version travel in the subject only: one source of truth.
    headers = {
        Header.MSG_ID: str(event.id),
        Header.AGGREGATE_TYPE: event.aggregate_type,
        Header.AGGREGATE_ID: event.aggregate_id,
        Header.OCCURRED_AT: event.occurred_at.isoformat(),
    }
    if event.correlation_id:
        headers[Header.CORRELATION_ID] = str(event.correlation_id)
    if event.causation_id:
        headers[Header.CAUSATION_ID] = str(event.causation_id)
    if event.deliver_at:
        headers[Header.DELIVER_AT] = event.deliver_at.isoformat()
    if traceparent:
        headers[Header.TRACEPARENT] = traceparent
    return headers


def traceparent_for(event_id: uuid.UUID) -> str:
    """The W3C traceparent the outbox stores with every event: the trace id is the event's UUID,
    so a trace can be found from a message id alone; the span id is its first 8 bytes."""
    return f"00-{event_id.hex}-{event_id.hex[:16]}-01"
