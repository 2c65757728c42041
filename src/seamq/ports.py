"""The ports of SDS-047 §7: what workers need, stated without a driver.

Workers depend on these Protocols; `seamq.pg` and `seamq.nats` implement
them. Tests run the real adapters against real servers, so the ports are for
keeping the layers honest, not for mocking.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping, NamedTuple, Protocol, TypeVar

from seamq.dead_letter import Action, DeadLetterRow, DlqFilter, Group, ReplayPolicy
from seamq.envelope import Envelope, HandlerResult
from seamq.model import OutMessage, PubResult  # the publisher port's values live in the core
from seamq.tables import ConsumerBacklog, ContextBacklog, ParkedRow, Purged

Tx = TypeVar("Tx")  # a repository's unit of work, which only the repository looks into


class OutboxRow(NamedTuple):
    """An unpublished outbox row, as the relay sees it (a tuple: built per row, so cheap)."""

    id: uuid.UUID
    context: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    event_version: int
    payload: str  # JSON text, published as is
    occurred_at: datetime
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    traceparent: str | None
    publish_attempts: int
    bucket: int  # the aggregate's (model.BUCKETS): a partitioned context puts it in the subject
    deliver_at: datetime | None  # a delayed event's time (Event.deliver_at)


class ClaimedBatch(Protocol):
    """Rows held by one relay until the batch ends (PORT-047-001)."""

    rows: list[OutboxRow]
    more: bool  # pending rows exist that this claim did not take (held by others, or beyond it)
    next_due: float | None  # seconds until the next delayed row is due (<= 0: due), None when none waits

    async def mark_published(self, ids: list[uuid.UUID], stream_seqs: list[int]) -> None: ...

    async def mark_failed(self, ids: list[uuid.UUID], errors: list[str], delays: list[float | None],
                          park: list[bool] | None = None) -> None:
        """`delays`: seconds each row waits before it is claimed again (seamq.backoff), None for no wait of
        its own (the broker was away: the relay waits instead); `park`: rows that can never be published
        as they are, set aside for a person."""


class OutboxRepository(Protocol):
    """PORT-047-001: findUnpublished (as a claim), markPublished, incrementAttempts."""

    async def release_due(self) -> int:
        """Delayed rows whose deliver_at has come: no longer held back from claims; how many."""

    def unavailable(self, exc: BaseException) -> bool:
        """True when `exc` says the database is away (the relay waits), not that a batch is bad."""

    def claim(self, limit: int) -> AbstractAsyncContextManager[ClaimedBatch]: ...

    async def backlog(self) -> list[ContextBacklog]:
        """Per context with any unpublished row, by context."""

    async def purge(self, older_than_seconds: float, batch: int = 5000) -> Purged:
        """Published rows older than the window."""

    # A person's work on the rows the relay parked: of a context, or one by id.
    async def parked(self, context: str | None, row_id: uuid.UUID | None, limit: int) -> list[ParkedRow]:
        """Oldest first."""

    async def unpark(self, context: str | None, row_id: uuid.UUID | None, to: str | None = None) -> int:
        """Handed back to the relay now, under context `to` when given; how many."""

    async def drop_parked(self, context: str | None, row_id: uuid.UUID | None) -> int:
        """Deleted, never to be published; how many."""


class Sleep(str, Enum):
    """What a relay about to sleep learns from `OutboxWakeup.asleep`."""

    REGISTERED = "registered"  # producers NOTIFY from now on: claim once more, then wait
    COVERED = "covered"  # producers NOTIFY already (this relay or another is registered)
    UNCOVERED = "uncovered"  # a producer that skipped its NOTIFY is still open: poll again soon


class OutboxWakeup(Protocol):
    """How a relay learns of new outbox rows without producers paying for it on every commit."""

    wake: asyncio.Event  # set by a NOTIFY, or when the wake-up was lost and rows may be waiting

    async def asleep(self) -> Sleep: ...

    async def awake(self) -> None:
        """Working again: producers may stop notifying."""


class JetStreamPublisher(Protocol):
    """PORT-047-003, batched: results come back in input order, and a message is stored only if every
    earlier one of its `key` was (else it comes back `held`)."""

    async def publish_many(self, messages: list[OutMessage]) -> list[PubResult]: ...


class Delivery(Protocol):
    """One message as the broker delivered it to a consumer, wrapped once at the edge (seamq.nats.pull):
    no broker type reaches a worker."""

    subject: str
    headers: dict[str, str]
    data: bytes
    delivered: int  # 1 on the first delivery
    stream: str
    seq: int  # stream sequence
    pending: int  # messages of the consumer not yet delivered after this one (its backlog)

    async def ack(self) -> None: ...

    async def nak(self, delay: float | None = None) -> None: ...


class DeliverySource(Protocol):
    """A durable consumer's deliveries; `stop_requesting()` then fetch until `drained` to stop cleanly."""

    drained: bool

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]: ...

    def missed(self) -> list[StoredMessage]:
        """Messages sent to this process that never arrived (seamq.nats.gaps), found since last asked:
        JetStream sends them again after ack_wait, and their aggregates wait for them."""

    def resumed(self) -> float | None:
        """When deliveries came again after this process lost its connection to the broker, or after a
        time when no consumer leader answered it, since last asked (time.monotonic()); None if neither.
        What was sent back before then may have been lost with either: it comes back within ack_wait
        from then (seamq.holds)."""

    def stop_requesting(self) -> None: ...


class Admission(str, Enum):
    """What the inbox says of a delivery it is shown (REQ-051, POL-047-005)."""

    NEW = "new"  # first time seen
    RETRY = "retry"  # seen, never processed: an earlier attempt failed or crashed
    REPLAY = "replay"  # dead-lettered, now replayed from the DLQ
    DUPLICATE = "duplicate"  # already processed (or dead-lettered and not a replay)


@dataclass(frozen=True, slots=True)
class InboxItem:
    message_id: uuid.UUID
    subject: str
    event_type: str | None
    event_version: int | None
    occurred_at: datetime | None
    replay: bool = False
    deliver_at: datetime | None = None  # a delayed event's time: its latency counts from there


@dataclass(frozen=True, slots=True)
class DeadLettered:
    reason: str
    detail: str
    dlq_subject: str
    dlq_seq: int | None


@dataclass(frozen=True, slots=True)
class InboxOutcome:
    """What became of one admitted message in the lane: handled, failed with an error, dead-lettered,
    or none of these (held back); plus how many further copies of it the lane skipped. `attempts`
    is how many times its handler has run now (this round: a DLQ replay starts a new one), and
    `attempted` whether it ran in this lane; a failed attempt is kept in its history."""

    message_id: uuid.UUID
    done: bool = False
    error: str | None = None
    dead_letter: DeadLettered | None = None
    copies: int = 0
    attempts: int = 1
    attempted: bool = True


class LaneWork(Protocol):
    """One lane's unit of work (`InboxRepository.transaction()`): the inbox's rows and an in-process
    handler's writes (through `conn`; None where there is no database) commit together when it
    ends, unless it was abandoned. A handler's attempt runs between `savepoint()` and either
    `release()` (kept) or `undo()` (its writes vanish, the lane goes on)."""

    conn: Any

    async def savepoint(self) -> None: ...

    async def release(self) -> None: ...

    async def undo(self) -> None: ...

    def abandon(self) -> None:
        """Nothing of the lane commits: it ends rolled back."""


class InboxRepository(Protocol):
    """PORT-047-002: insert (admit), markProcessed and recordError (record), in one transaction.

    `transaction()` is the unit of work of one lane (LaneWork). How the rows
    are written is the repository's business, and so is what it admitted:
    `record` is told what became of each message, not again how it came in.
    """

    def unavailable(self, exc: BaseException) -> bool:
        """True when `exc` says the database is away, not that something is wrong with the messages."""

    def transaction(self) -> AbstractAsyncContextManager[LaneWork]: ...

    async def admit(self, tx: LaneWork, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Admission, int]]:
        """Per message id: its admission and how many attempts its handler made before (0 when new or
        replayed); rows stay locked until the commit."""

    async def record(self, tx: LaneWork, outcomes: list[InboxOutcome]) -> None: ...

    async def failed_alone(self, item: InboxItem, error: str) -> int:
        """A message's own transaction failed, so nothing of it was recorded: count the attempt and
        keep its error, in a transaction of its own; returns its attempts now."""


class InboxTables(Protocol):
    """Every consumer's inbox rows at once, for people: what waits, and retention."""

    async def backlog(self) -> list[ConsumerBacklog]:
        """Per consumer with any row received and not processed, by consumer."""

    async def purge(self, older_than_seconds: float, batch: int = 5000) -> Purged:
        """Processed rows older than the window."""


class Handler(Protocol):
    """SDS-047 §12: one event version's handler (HTTP or in-process); `transactional` ones write
    through the inbox's transaction, so they run under its savepoints."""

    transactional: bool

    async def __call__(self, envelope: Envelope[Any], conn: Any, traceparent: str | None = None) -> HandlerResult:
        """`conn`: the lane's connection (LaneWork.conn), whatever driver the application writes with."""


HandlerLookup = Callable[[str, int], "Handler | None"]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    subject: str
    headers: dict[str, str]
    data: bytes
    seq: int = 0  # its stream sequence, where the reader needs it


class Indexed(NamedTuple):
    """A stream message as the audit reads it: where it is and whose it is (seamq.nats.stream_index)."""

    seq: int
    subject: str
    message_id: uuid.UUID | None  # the event's id (a copy's original); None: not one of seamq's
    copy: bool  # published again (seamq.republish), not by the relay from its row
    for_consumer: str | None  # a replay or edited copy for this consumer alone


class StreamIndex(Protocol):
    """What a stream holds, by sequence, for the audit."""

    async def bounds(self, stream: str) -> tuple[int, int]: ...

    async def ack_floor(self, stream: str, durable: str) -> int | None: ...

    async def filters(self, stream: str, durable: str) -> list[str]: ...

    async def seq_at(self, stream: str, when: datetime) -> int | None: ...

    async def read(self, stream: str, first: int, last: int, subjects: list[str] | None = None) -> list[Indexed]: ...


class Walked(NamedTuple):
    """Where one of the audit's walks has got to: a time and id (published rows), or a stream sequence."""

    at: datetime | None = None
    id: uuid.UUID | None = None
    seq: int | None = None


class PublishedRow(NamedTuple):
    id: uuid.UUID
    stream_seq: int | None
    published_at: datetime


class Finding(NamedTuple):
    """Something the audit found missing (seamq.audit.Kind says what)."""

    kind: str
    scope: str  # the context, or the consumer
    message_id: uuid.UUID
    stream: str
    stream_seq: int | None
    detail: str


class AuditStore(Protocol):
    """The database side of the audit (seamq.audit): one named query per method (seamq.pg.audit_repo)."""

    async def now(self) -> datetime: ...

    async def cursor(self, walk: str) -> Walked | None: ...

    async def save_cursor(self, walk: str, at: Walked) -> None: ...

    async def published(self, context: str, after: Walked, settle: float, limit: int) -> list[PublishedRow]: ...

    async def outbox_has(self, ids: list[uuid.UUID]) -> set[uuid.UUID]: ...

    async def outbox_rows(self, ids: list[uuid.UUID]) -> list[OutboxRow]: ...

    async def inbox_done(self, consumer: str, ids: list[uuid.UUID]) -> set[uuid.UUID]: ...

    async def found(self, findings: list[Finding]) -> set[uuid.UUID]:
        """Record findings; the ids not found before."""

    async def unrepaired(self, context: str, limit: int) -> list[uuid.UUID]:
        """Rows found missing from the context's stream and not yet published again."""

    async def repaired(self, context: str, ids: list[uuid.UUID], seqs: list[int]) -> None: ...


class MessageStore(Protocol):
    """Messages read back from a stream by sequence: dead-letter copies, originals too big for them."""

    async def get(self, stream: str, seq: int) -> StoredMessage | None:
        """None when the message is gone (expired, purged, deleted)."""

    async def delete(self, stream: str, seq: int) -> bool:
        """False when it was gone already."""


class DeadLetterRepository(Protocol[Tx]):
    """The inbox's dead-lettered rows as the DLQ replay worker (REQ-059) and the desk (seamq.dlq_desk:
    the CLI and the console) need them; `Tx` is the repository's own unit of work, opaque to them."""

    def transaction(self) -> AbstractAsyncContextManager[Tx]: ...

    async def schedule(self, tx: Tx, policy: ReplayPolicy) -> None:
        """Mark exhausted what is out of replays; give a replay time to what is not."""

    async def due(self, tx: Tx, limit: int = 100) -> list[DeadLetterRow]:
        """Rows whose replay time has come, earliest first, locked for `tx`."""

    async def mark_replayed(self, tx: Tx, consumer: str, message_id: uuid.UUID, watchdog: float) -> None:
        """Count the replay; the row is due again after `watchdog` seconds unless it comes back first."""

    async def select(self, tx: Tx, selection: DlqFilter) -> list[DeadLetterRow]:
        """Dead letters, oldest dead-lettered first, each with the selection's total."""

    async def groups(self, tx: Tx, selection: DlqFilter) -> list[Group]:
        """The selection by cause, the largest group first."""

    async def with_attempts(self, tx: Tx, rows: list[DeadLetterRow]) -> list[DeadLetterRow]:
        """The rows with their failed attempts, oldest first."""

    async def inbox_rows(self, tx: Tx, prefix: str) -> list[DeadLetterRow]:
        """Inbox rows in any state whose message id starts with `prefix` (at most 50), by id and consumer."""

    async def mark_purged(self, tx: Tx, consumer: str, message_id: uuid.UUID) -> None: ...

    async def mark_edited(self, tx: Tx, consumer: str, message_id: uuid.UUID, new_id: uuid.UUID,
                          actor: str) -> bool:
        """Close the original of an edit-and-replay; False when it was closed already."""

    async def start_action(self, tx: Tx, actor: str, action: str, message_ids: list[uuid.UUID],
                           detail: Mapping[str, object]) -> int: ...

    async def finish_action(self, tx: Tx, action_id: int, done: int, detail: Mapping[str, object]) -> None: ...

    async def actions(self, tx: Tx, limit: int = 100, message_id: uuid.UUID | None = None) -> list[Action]:
        """The latest actions first; of one message, every one that named it, oldest first."""
