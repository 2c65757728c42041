"""The ports of SDS-047 §7: what workers need, stated without a driver.

Workers depend on these Protocols; `seamq.pg` and `seamq.nats` implement
them. Tests run the real adapters against real servers, so the ports are for
keeping the layers honest, not for mocking.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, Protocol



@dataclass(frozen=True, slots=True)
class OutMessage:
    subject: str
    payload: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class PubResult:
    ok: bool
    stream: str | None = None
    seq: int | None = None
    duplicate: bool = False
    error: str | None = None


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


class ClaimedBatch(Protocol):
    """Rows held by one relay until the batch ends (PORT-047-001)."""

    rows: list[OutboxRow]
    more: bool  # pending rows exist that this claim did not take (held by others, or beyond it)

    async def mark_published(self, ids: list[uuid.UUID], stream_seqs: list[int]) -> None: ...

    async def mark_failed(self, ids: list[uuid.UUID], errors: list[str], retry_later: list[bool]) -> None: ...


class OutboxRepository(Protocol):
    """PORT-047-001: findUnpublished (as a claim), markPublished, incrementAttempts."""

    def claim(self, limit: int) -> AbstractAsyncContextManager[ClaimedBatch]: ...

    async def backlog(self) -> list[dict[str, Any]]: ...

    async def purge(self, older_than_seconds: float, batch: int = 5000) -> int: ...


class JetStreamPublisher(Protocol):
    """PORT-047-003, batched: results come back in input order."""

    async def publish_many(self, messages: list[OutMessage]) -> list[PubResult]: ...


class Claim(str, Enum):
    NEW = "new"  # first time seen; recorded as processed unless `not_processed` says otherwise
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


class InboxRepository(Protocol):
    """PORT-047-002: insert (as a claim), markProcessed, recordError; on the caller's transaction.

    New messages are recorded as processed when claimed, since nearly all will
    be by the commit; the caller reverts those that were not (`not_processed`)
    in the same transaction. `processed` is for retries and replays.
    """

    def unavailable(self, exc: BaseException) -> bool:
        """True when `exc` says the database is away, not that something is wrong with the messages."""

    async def claim(self, conn: Any, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Claim, int]]: ...

    async def processed(self, conn: Any, ids: list[uuid.UUID]) -> None: ...

    async def not_processed(self, conn: Any, ids: list[uuid.UUID]) -> None: ...

    async def duplicate(self, conn: Any, ids: list[uuid.UUID]) -> None: ...

    async def failed(self, conn: Any, ids: list[uuid.UUID], errors: list[str]) -> None: ...

    async def dead_lettered(self, conn: Any, ids: list[uuid.UUID], reasons: list[str], details: list[str],
                            dlq_subjects: list[str], dlq_seqs: list[int | None]) -> None: ...
