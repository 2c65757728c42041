"""Dead letters (EVT-047-002, CMD-052) in one home: where they go, what they are called, what they carry,
and how their original is read back. No I/O: the consumer publishes them, the replay worker and
`seamq dlq` read them, through their ports.

- subject: `{target}.dlq.{source}.{event}.v{n}` in the target context's DLQ stream (the consumer's
  context owns its failures); `._invalid` when the original subject is not an event subject;
- Nats-Msg-Id `dlq:{consumer}:{message id or stream:seq}:{replay round}`: one dead letter per
  message and replay round, even when a crash makes the consumer route it twice;
- header `Seamq-Dlq-Reason`: the reason, for filters that do not parse bodies;
- body: the reason, the detail, the original (embedded, or where to find it when too big);
- its inbox row's state (`State`): where its copy is, its replays, whether people closed it;
- when it is replayed by itself (`ReplayPolicy`, REQ-059).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import Any, Mapping, Protocol

from seamq.backoff import Backoff
from seamq.envelope import Reason
from seamq.model import EventSubject, Header, OutMessage, SeamqError

HEADROOM = 1024  # bytes of a dead letter's size limit kept for its own headers and the protocol


class Owner(Protocol):
    """The consumer whose dead letter it is, as far as a dead letter knows it (a topology's
    ConsumerSpec is one): its name, its own context, and the context it reads from."""

    name: str
    target: str
    source: str


def subject(spec: Owner, original_subject: str) -> str:
    prefix = f"{spec.target}.dlq.{spec.source}"
    try:
        event = EventSubject.parse(original_subject)
    except SeamqError:
        return f"{prefix}._invalid"
    return f"{prefix}.{event.name}.v{event.version}"


def message(spec: Owner, *, reason: Reason, detail: str, message_id: uuid.UUID | None,
            original_subject: str, headers: Mapping[str, str], data: bytes, stream: str, seq: int,
            attempts: int, max_payload: int) -> OutMessage:
    """The dead letter of one delivery, ready to publish."""
    key = str(message_id) if message_id else f"{stream}:{seq}"
    replay = headers.get(Header.REPLAY_ATTEMPT, "0")
    body = dead_letter_body(
        message_id=message_id, original_subject=original_subject, reason=reason, detail=detail, attempts=attempts,
        consumer=spec.name, headers=headers, data=data, stream=stream, stream_seq=seq,
        limit=max_payload - HEADROOM,
    )
    return OutMessage(subject(spec, original_subject), body,
                      {Header.MSG_ID: f"dlq:{spec.name}:{key}:{replay}", Header.DLQ_REASON: reason.value})


def read(data: bytes) -> "Original":
    """The original a published dead letter stands for (as far as its body carries it)."""
    return original_message(json.loads(data))


def dead_letter_body(
    *, message_id: uuid.UUID | None, original_subject: str, reason: Reason, detail: str, attempts: int,
    consumer: str, headers: Mapping[str, str] | None, data: bytes, stream: str | None, stream_seq: int | None,
    limit: int | None = None,
) -> bytes:
    """EVT-047-002 MessageDeadLettered, carrying the original so it can be replayed.

    A dead letter must be publishable whatever the original's size. Embedded
    (escaped or base64) a large original no longer fits in one message, so
    when the body would exceed `limit` (the largest message the server takes,
    less room for headers) it carries where the original is instead: its
    stream and sequence, payload first, then the headers too. `original_message`
    says what is missing; replay and `seamq dlq show` read it from the stream.
    """
    try:
        payload, encoding = data.decode(), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(data).decode(), "base64"
    body = {
        "message_id": str(message_id) if message_id else None,
        "original_subject": original_subject,
        "reason": reason.value,
        "detail": detail[:2000],
        "attempts": attempts,
        "consumer": consumer,
        "original_stream": stream,
        "stream_seq": stream_seq,
        "dead_lettered_at": datetime.now(timezone.utc).isoformat(),
        "original_headers": dict(headers or {}),
        "original_payload": payload,
        "original_payload_encoding": encoding,
    }
    encoded = json.dumps(body).encode()
    for drop in ({"original_payload": None, "original_payload_encoding": "stream"}, {"original_headers": None}):
        if limit is None or len(encoded) <= limit:
            break
        body.update(drop)
        encoded = json.dumps(body).encode()
    return encoded


@dataclass(frozen=True, slots=True)
class Original:
    """The message a dead letter stands for; `headers` or `data` None: read it from `stream` at `seq`."""

    subject: str
    headers: dict[str, str] | None
    data: bytes | None
    stream: str | None
    seq: int | None

    @property
    def complete(self) -> bool:
        return self.headers is not None and self.data is not None

    def whole(self) -> "Whole | None":
        """It, read back whole; None while a part of it is still to be read from its stream."""
        if self.headers is None or self.data is None:
            return None
        return Whole(self.subject, self.headers, self.data, self.stream, self.seq)


@dataclass(frozen=True, slots=True)
class Whole:
    """An original with nothing left to read: what a replay or an edit sends."""

    subject: str
    headers: dict[str, str]
    data: bytes
    stream: str | None
    seq: int | None


def original_message(body: Mapping[str, Any]) -> Original:
    """The original of a dead letter body, as far as the body carries it (see dead_letter_body)."""
    encoding, payload = body.get("original_payload_encoding"), body.get("original_payload")
    if encoding == "stream" or payload is None:
        data = None
    elif encoding == "base64":
        data = base64.b64decode(payload)
    else:
        data = payload.encode()
    headers = body.get("original_headers")
    return Original(body["original_subject"], dict(headers) if headers is not None else None, data,
                    body.get("original_stream"), body.get("stream_seq"))


@dataclass(frozen=True, slots=True)
class State:
    """A dead-lettered inbox row's state, as every reader sees it: typed, and its keys named here
    once. PostgreSQL keeps it as the row's `dlq_metadata` (JSONB, written by queries.sql); the CLI,
    the console and the replay worker read it through `State.of`, never by key."""

    reason: str | None = None
    detail: str | None = None
    dlq_subject: str | None = None  # where its copy is: subject and sequence in the DLQ stream
    dlq_seq: int | None = None
    dead_lettered_at: datetime | None = None
    replay_attempts: int = 0  # automatic and by people (REQ-059)
    replay_delay: float | None = None  # seconds, as drawn for the next automatic replay
    next_replay_at: datetime | None = None
    last_replayed_at: datetime | None = None
    last_reason: str | None = None  # the reason before the last replay
    exhausted_at: datetime | None = None  # out of automatic replays
    purged_at: datetime | None = None  # closed: its copy deleted, its row kept to deduplicate
    edited_as: str | None = None  # closed: replayed as a new message of this id
    edited_at: datetime | None = None
    edited_by: str | None = None
    replay_scheduled_at: datetime | None = None

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> "State":
        """The state as stored (a JSON object; None or unknown keys are nothing); a value of the
        wrong type is left out rather than trusted."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            value = (stored or {}).get(field.name)
            if value is None:
                continue
            try:
                if field.name.endswith("_at"):
                    value = value if isinstance(value, datetime) else datetime.fromisoformat(value)
                elif field.name in ("dlq_seq", "replay_attempts"):
                    value = int(value)
                elif field.name == "replay_delay":
                    value = float(value)
                else:
                    value = str(value)
            except (TypeError, ValueError):
                continue
            values[field.name] = value
        return cls(**values)

    @property
    def closed(self) -> bool:
        """People closed it: purged, or edited and replayed as another message."""
        return self.purged_at is not None or self.edited_as is not None


@dataclass(frozen=True)
class ReplayPolicy:
    """REQ-059: when a dead letter is replayed, and how often (defaults: ReplaySettings, the one place)."""

    backoff: Backoff  # replay number n (0-based) waits backoff.delay(n + 1)
    max_attempts: int
    reasons: tuple[str, ...]

    def bounds(self, replays: int) -> tuple[float, float]:
        """Earliest and latest delay of the replay after `replays` replays."""
        return self.backoff.bounds(replays + 1)

    def delay(self, replays: int) -> float:
        return self.backoff.delay(replays + 1)


_BLANKED = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}|(?<!HTTP )(?<![0-9])[0-9]+")


def cause(reason: str | None, error: str | None) -> str:
    """What dead letters are grouped by: the reason, and the error without its ids and numbers (an
    HTTP status stays). PostgreSQL computes it as `seamq_dlq_cause` (migration 0012) to group and
    filter in SQL; the dead-letter contract suite holds the two to one answer."""
    text = error or ""
    if reason is not None and text.startswith(f"{reason}: "):
        text = text[len(reason) + 2:]
    return f"{reason or '?'}: {_BLANKED.sub('#', text)[:120]}"


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """Which dead letters a person means: every filter is optional (None means any)."""

    consumer: str | None = None
    context: str | None = None  # the consumer's own (target) context
    event_type: str | None = None
    reason: str | None = None
    older_than: float | None = None  # seconds since it was dead-lettered
    ids: list[uuid.UUID] | None = None
    prefix: str | None = None  # of a message id, as `dlq list` shows it cut
    purged: bool = False  # closed ones too: purged (the row stays to deduplicate), or edited and replayed
    since: datetime | None = None  # received at or after
    until: datetime | None = None  # received before
    text: str | None = None  # in the last error, any case
    cause: str | None = None  # as grouped (seamq_dlq_cause, migration 0008)
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt of a handler, as its message's history keeps it."""

    attempt: int
    failed_at: datetime
    error: str | None


@dataclass(frozen=True, slots=True)
class Action:
    """What a person did to dead letters (operator_actions): unfinished while `finished_at` is None."""

    id: int
    started_at: datetime
    finished_at: datetime | None
    actor: str
    action: str
    selected: int
    done: int | None
    messages: int
    detail: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Group:
    """Dead letters of one cause (the reason and the error with its ids and numbers blanked)."""

    cause: str
    reason: str | None
    count: int
    consumers: int
    first_at: datetime | None
    last_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """An inbox row as people and the replay see it: a dead letter's (`seamq dlq`, the console), or a
    row in any state (`seamq inbox show`), whose `state` is then empty. Built once, by the
    repository; `seamq dlq show` and the console's message page fill in its history with
    `dataclasses.replace`, never by changing it."""

    consumer: str
    message_id: uuid.UUID
    state: State = State()
    subject: str = ""
    event_type: str | None = None
    event_version: int | None = None
    status: str = "dead_lettered"
    attempts: int = 0
    duplicates: int = 0
    last_error: str | None = None
    received_at: datetime | None = None
    processed_at: datetime | None = None
    cause: str | None = None
    total: int = 1  # how many rows the selection it came from matched (beyond its limit too)
    # Its history, None where it was not read (a list of dead letters does not read it):
    failed_attempts: tuple[FailedAttempt, ...] | None = None
    actions: tuple[Action, ...] | None = None  # what people did to it
    dlq_copy: Mapping[str, Any] | None = None  # the DLQ copy's body, or {"error": why it cannot be had}

    @property
    def key(self) -> tuple[str, uuid.UUID]:
        return self.consumer, self.message_id

    @property
    def event(self) -> str:
        """Its event as `name.vN`: from its columns, or, for a message that could not be read
        (invalid JSON, no envelope), from its subject, so every row says it the same way."""
        if self.event_type:
            return f"{self.event_type}.v{self.event_version}" if self.event_version else self.event_type
        try:
            subject = EventSubject.parse(self.subject)
        except SeamqError:
            return self.subject or "-"
        return f"{subject.name}.v{subject.version}"

    def plain(self) -> dict[str, Any]:
        """What `--json` prints: every column, the state under `dlq_metadata` with the keys it is stored
        under (those set), and its history where it was read."""
        history = ("failed_attempts", "actions", "dlq_copy")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("state", *history)}
        out["dlq_metadata"] = {f.name: getattr(self.state, f.name) for f in fields(State)
                               if getattr(self.state, f.name) != f.default}
        for name in history:
            if (value := getattr(self, name)) is not None:
                out[name] = value if name == "dlq_copy" else [asdict(entry) for entry in value]
        return out
