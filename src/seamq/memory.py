"""In-memory adapters of the consumer's ports: the real InboxConsumer runs over them without services.

seamq.testing (the users' kit) runs their handlers through the real consumer
on these, so the kit cannot judge a message otherwise than production does;
seamq's own unit tier runs the consumer's lane on them in milliseconds.

They keep each port's contract, not the adapters' tricks: the inbox records
states plainly and rolls back with its transaction; deliveries come back after
a NAK's delay with their delivery count up, as JetStream redelivers. The
end-to-end tests run the real adapters against real servers.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from seamq.dead_letter import FailedAttempt, State
from seamq.model import OutMessage, PubResult
from seamq.ports import Admission, InboxItem, InboxOutcome, StoredMessage


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Row:
    """An inbox row; `dlq` holds a dead letter's state under the keys PostgreSQL's `dlq_metadata` has
    (seamq.dead_letter.State), so seamq.memory_dead_letters reads it as the desk's rows are read."""

    subject: str = ""
    event_type: str | None = None
    event_version: int | None = None
    received_at: datetime = field(default_factory=now)
    status: str = "received"
    attempts: int = 0
    duplicates: int = 0
    last_error: str | None = None
    processed_at: datetime | None = None
    dlq: dict[str, Any] = field(default_factory=dict)
    history: list[FailedAttempt] = field(default_factory=list)  # failed attempts, oldest first

    @classmethod
    def of(cls, item: InboxItem) -> "Row":
        return cls(item.subject, item.event_type, item.event_version)

    @property
    def state(self) -> State:
        return State.of(self.dlq)

    def failed(self, attempt: int, error: str | None) -> None:
        self.history.append(FailedAttempt(attempt, now(), error))


class MemoryInbox:
    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, Row] = {}

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        return False

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["MemoryLaneWork"]:
        before = copy.deepcopy(self.rows)
        work = MemoryLaneWork(None)
        try:
            yield work
        except BaseException:
            self.rows = before  # rolled back
            raise
        if work.abandoned:
            self.rows = before

    async def admit(self, tx: MemoryLaneWork, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Admission, int]]:
        out = {}
        for item in items:
            row = self.rows.get(item.message_id)
            if item.message_id in out:  # copies of one message in one lane: one row, one admission
                continue
            if row is None:
                self.rows[item.message_id] = Row.of(item)
                out[item.message_id] = (Admission.NEW, 0)
            elif row.status == "received":
                out[item.message_id] = (Admission.RETRY, row.attempts)
            elif row.status in ("dead_lettered", "exhausted") and item.replay:
                row.attempts, row.status = 0, "received"
                out[item.message_id] = (Admission.REPLAY, 0)
            else:
                row.duplicates += 0 if item.replay else 1
                out[item.message_id] = (Admission.DUPLICATE, row.attempts)
        return out

    async def record(self, tx: MemoryLaneWork, outcomes: list[InboxOutcome]) -> None:
        for o in outcomes:
            row = self.rows[o.message_id]
            row.duplicates += o.copies
            row.attempts = o.attempts
            dead = o.dead_letter
            if o.attempted and not o.done:
                row.failed(o.attempts, dead.detail if dead else o.error)
            if dead is not None:
                row.status, row.last_error = "dead_lettered", f"{dead.reason}: {dead.detail}"[:2000]
                row.dlq.update(reason=dead.reason, detail=dead.detail[:2000], dlq_subject=dead.dlq_subject,
                               dlq_seq=dead.dlq_seq, dead_lettered_at=now(), next_replay_at=None)
            elif o.done:
                row.status, row.processed_at = "processed", now()
                row.dlq.pop("next_replay_at", None)
            elif o.error is not None:
                row.last_error = o.error

    async def failed_alone(self, item: InboxItem, error: str) -> int:
        row = self.rows.setdefault(item.message_id, Row.of(item))
        row.attempts += 1
        row.last_error = error
        row.failed(row.attempts, error)
        return row.attempts


class MemoryTransaction:
    """Stands in for a database connection: records what a handler executes. What a savepoint
    undoes, or an abandoned lane rolls back, is no longer recorded, as in PostgreSQL."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> "MemoryTransaction":
        self.statements.append((str(query), params))
        return self

    def cursor(self, *args: Any, **kwargs: Any) -> "MemoryTransaction":
        return self

    async def __aenter__(self) -> "MemoryTransaction":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def executemany(self, query: Any, params_seq: Any) -> None:
        for params in params_seq:
            self.statements.append((str(query), params))


class MemoryLaneWork:
    """A lane's unit of work; `conn`, when there is one, is what handlers write through."""

    def __init__(self, conn: MemoryTransaction | None) -> None:
        self.conn = conn
        self.abandoned = False
        self._start = self._mark = len(conn.statements) if conn else 0

    async def savepoint(self) -> None:
        self._mark = len(self.conn.statements) if self.conn else 0

    async def release(self) -> None: ...

    async def undo(self) -> None:
        if self.conn:
            del self.conn.statements[self._mark:]

    def abandon(self) -> None:
        self.abandoned = True
        if self.conn:
            del self.conn.statements[self._start:]


class NoInbox:
    """At-least-once mode (`consumer.inbox: false`): nothing recorded, every delivery handled.

    For handlers that are idempotent on their own, and for measuring what the
    inbox costs. No exactly-once guarantee comes from seamq in this mode.
    """

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        return False

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["MemoryLaneWork"]:
        yield MemoryLaneWork(None)  # handlers get no connection; savepoints are nothing

    async def admit(self, tx: MemoryLaneWork, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Admission, int]]:
        return {}

    async def record(self, tx: MemoryLaneWork, outcomes: list[InboxOutcome]) -> None: ...

    async def failed_alone(self, item: InboxItem, error: str) -> None:
        return None  # nothing counts attempts: the consumer goes by JetStream's deliveries


@dataclass
class MemoryDelivery:
    subject: str
    headers: dict[str, str]
    data: bytes
    seq: int
    source: "MemoryDeliveries"
    delivered: int = 1
    stream: str = "TEST_EVENTS"
    pending: int = 0

    async def ack(self) -> None:
        self.source.acked.append(self)

    async def nak(self, delay: float | None = None) -> None:
        self.source.naks.append((self.seq, delay))
        if self.source.redeliver:
            again = MemoryDelivery(self.subject, self.headers, self.data, self.seq, self.source, self.delivered + 1)
            asyncio.get_running_loop().call_later(delay or 0, lambda: self.source.ready.append(again))


class MemoryDeliveries:
    """A stream of messages and its one consumer: fetch hands out what is ready, in order; a NAKed
    one comes back after its delay (unless `redeliver` is off: the kit looks at one delivery)."""

    def __init__(self, *, redeliver: bool = True) -> None:
        self.redeliver = redeliver
        self.ready: list[MemoryDelivery] = []
        self.acked: list[MemoryDelivery] = []
        self.naks: list[tuple[int, float | None]] = []
        self.seq = 0
        self.fetched = 0
        self.max_ack_pending = 1_000_000
        self.lost: list[StoredMessage] = []
        self.resumed_at: float | None = None
        self._stopping = False

    def publish(self, subject: str, headers: dict[str, str], data: bytes, delivered: int = 1) -> MemoryDelivery:
        """A message on the stream, ready to fetch (as its `delivered`-th delivery)."""
        self.seq += 1
        delivery = MemoryDelivery(subject, headers, data, self.seq, self, delivered)
        self.ready.append(delivery)
        return delivery

    def lose(self, delivery: MemoryDelivery, back_after: float) -> None:
        """It was sent and never arrived (a connection cut): noticed as missed, and sent again after
        `back_after` (JetStream's ack_wait)."""
        self.ready.remove(delivery)
        self.lost.append(StoredMessage(delivery.subject, delivery.headers, delivery.data, delivery.seq))
        again = MemoryDelivery(delivery.subject, delivery.headers, delivery.data, delivery.seq, self,
                               delivery.delivered + 1)
        asyncio.get_running_loop().call_later(back_after, lambda: self.ready.append(again))

    async def fetch(self, batch: int, timeout: float) -> list[MemoryDelivery]:
        room = self.max_ack_pending - (self.fetched - len(self.acked) - len(self.naks))
        if not self.ready or room <= 0:  # as JetStream: nothing more while max_ack_pending are out
            await asyncio.sleep(min(timeout, 0.005))
            return []
        out, self.ready = self.ready[:min(batch, room)], self.ready[min(batch, room):]
        self.fetched += len(out)
        for delivery in out:
            delivery.pending = len(self.ready)
        return out

    def missed(self) -> list[StoredMessage]:
        """What `lose()` took away on the way since last asked."""
        found, self.lost = self.lost, []
        return found

    def reconnected(self) -> None:
        """The connection came back: what the broker sent meanwhile was lost (`resumed()`)."""
        self.resumed_at = time.monotonic()

    def resumed(self) -> float | None:
        at, self.resumed_at = self.resumed_at, None
        return at

    def stop_requesting(self) -> None:
        self._stopping = True

    @property
    def drained(self) -> bool:
        return self._stopping and not self.ready


@dataclass
class MemoryPublisher:
    published: list[OutMessage] = field(default_factory=list)
    fail: bool = False

    async def publish_many(self, messages: list[OutMessage]) -> list[PubResult]:
        if self.fail:
            return [PubResult(False, error="no responders") for _ in messages]
        self.published += messages
        return [PubResult(True, len(self.published) - len(messages) + i + 1) for i in range(len(messages))]


class MemoryMessages:
    """Messages of streams by sequence (the MessageStore port): dead-letter copies a test put there."""

    def __init__(self) -> None:
        self.streams: dict[str, dict[int, StoredMessage]] = {}

    def put(self, stream: str, message: OutMessage) -> int:
        held = self.streams.setdefault(stream, {})
        seq = max(held, default=0) + 1
        held[seq] = StoredMessage(message.subject, dict(message.headers), message.payload, seq)
        return seq

    async def get(self, stream: str, seq: int) -> StoredMessage | None:
        return self.streams.get(stream, {}).get(seq)

    async def delete(self, stream: str, seq: int) -> bool:
        return self.streams.get(stream, {}).pop(seq, None) is not None
