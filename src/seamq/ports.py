"""The ports of SDS-047 §7: what workers need, stated without a driver.

Workers depend on these Protocols; `seamq.pg` and `seamq.nats` implement
them. Tests run the real adapters against real servers, so the ports are for
keeping the layers honest, not for mocking.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from seamq.nats.publisher import OutMessage, PubResult


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
