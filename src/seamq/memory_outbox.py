"""The outbox in memory (the OutboxRepository port): the relay runs on it without services, in the
unit tier.

It keeps the port's contract (tests/contracts/messaging/test_outbox_contract.py runs one suite against it and against
PostgreSQL), not PostgreSQL's ways: one relay's claim holds its aggregates' buckets until it ends,
so no other claim publishes those aggregates meanwhile; an aggregate waits behind its own row that
is backing off; a delayed row is held until `release_due`; marks apply when the claim ends, and a
claim that fails leaves its rows as they were. Buckets come from a hash of its own, not
PostgreSQL's: one aggregate, one bucket, is the promise.
"""

from __future__ import annotations

import dataclasses
import uuid
import zlib
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import AsyncIterator, Callable

from seamq.memory import now
from seamq.model import BUCKETS, Event
from seamq.outbox import row_values
from seamq.ports import OutboxRow
from seamq.tables import ContextBacklog, ParkedRow, Purged

FOREVER = datetime.max.replace(tzinfo=now().tzinfo)  # a parked row's next attempt


@dataclass
class Entry:
    """An outbox row and what the relay and people wrote on it."""

    row: OutboxRow
    seq: int
    held: bool
    published_at: datetime | None = None
    next_attempt_at: datetime | None = None
    publish_error: str | None = None
    parked_reason: str | None = None
    parked_at: datetime | None = None
    created_at: datetime = field(default_factory=now)

    @property
    def aggregate(self) -> tuple[str, str]:
        return self.row.aggregate_type, self.row.aggregate_id


@dataclass
class MemoryClaimedBatch:
    outbox: "MemoryOutbox" = field(repr=False)
    rows: list[OutboxRow]
    more: bool
    next_due: float | None
    marks: list[Callable[[], None]] = field(default_factory=list)  # applied when the claim ends well

    async def mark_published(self, ids: list[uuid.UUID], stream_seqs: list[int]) -> None:
        self.marks.append(lambda: self.outbox.published(ids, stream_seqs))

    async def mark_failed(self, ids: list[uuid.UUID], errors: list[str], delays: list[float | None],
                          park: list[bool] | None = None) -> None:
        self.marks.append(lambda: self.outbox.failed(ids, errors, delays, park or [False] * len(ids)))


class MemoryOutbox:
    def __init__(self, *, buckets_per_claim: int = 16) -> None:
        self.entries: dict[uuid.UUID, Entry] = {}
        self.buckets_per_claim = buckets_per_claim
        self.locked: set[int] = set()  # buckets a running claim holds
        self.written = 0  # rows ever added: the next one's seq

    def add(self, event: Event, *, deliver_at: datetime | None = None) -> None:
        """As `seamq.outbox.add` in a transaction that commits: the row, checked the same way."""
        values = row_values(dataclasses.replace(event, deliver_at=deliver_at) if deliver_at else event)
        aggregate = f"{values['aggregate_type']}/{values['aggregate_id']}"
        row = OutboxRow(values["id"], values["context"], values["aggregate_type"], values["aggregate_id"],
                        values["event_type"], values["event_version"], values["payload"], values["occurred_at"],
                        values["correlation_id"], values["causation_id"], values["traceparent"], 0,
                        zlib.crc32(aggregate.encode()) % BUCKETS, values["deliver_at"])
        held = row.deliver_at is not None and row.deliver_at > now()
        self.written += 1
        self.entries[row.id] = Entry(row, self.written, held)

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        return False

    def _pending(self, at: datetime) -> list[Entry]:
        """Unpublished rows a claim may take, in write order: not held, not waiting, not behind their
        aggregate's own row that is waiting."""
        blocked: dict[tuple[str, str], int] = {}
        for e in self.entries.values():
            if e.published_at is None and e.next_attempt_at is not None and e.next_attempt_at > at:
                blocked[e.aggregate] = min(blocked.get(e.aggregate, e.seq), e.seq)
        return sorted((e for e in self.entries.values()
                       if e.published_at is None and not e.held and e.seq <= blocked.get(e.aggregate, e.seq)
                       and (e.next_attempt_at is None or e.next_attempt_at <= at)), key=lambda e: e.seq)

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[MemoryClaimedBatch]:
        at = now()
        pending = self._pending(at)
        buckets = list(dict.fromkeys(e.row.bucket for e in pending if e.row.bucket not in self.locked))
        mine = set(buckets[:self.buckets_per_claim])
        waiting = {e.row.bucket for e in pending}
        held = [e.row.deliver_at for e in self.entries.values() if e.held and e.row.deliver_at is not None]
        batch = MemoryClaimedBatch(self, [e.row for e in pending if e.row.bucket in mine][:limit],
                                   len(waiting) > len(mine), (min(held) - at).total_seconds() if held else None)
        self.locked |= mine
        try:
            yield batch
            for mark in batch.marks:
                mark()
        finally:
            self.locked -= mine

    def published(self, ids: list[uuid.UUID], stream_seqs: list[int]) -> None:
        for row_id in ids:
            e = self.entries[row_id]
            e.row = e.row._replace(publish_attempts=e.row.publish_attempts + 1)
            e.published_at, e.publish_error, e.next_attempt_at = now(), None, None

    def failed(self, ids: list[uuid.UUID], errors: list[str], delays: list[float | None], park: list[bool]) -> None:
        for row_id, error, delay, parked in zip(ids, errors, delays, park):
            e = self.entries[row_id]
            e.row = e.row._replace(publish_attempts=e.row.publish_attempts + 1)
            e.publish_error = error[:2000]
            e.next_attempt_at = FOREVER if parked else (now() + timedelta(seconds=delay) if delay is not None
                                                        else None)
            e.parked_reason, e.parked_at = (error[:2000], now()) if parked else (None, None)

    async def release_due(self) -> int:
        due = [e for e in self.entries.values() if e.held and e.row.deliver_at is not None and e.row.deliver_at <= now()]
        for e in due:
            e.held = False
        return len(due)

    async def backlog(self) -> list[ContextBacklog]:
        out: dict[str, ContextBacklog] = {}
        for e in self.entries.values():
            if e.published_at is not None:
                continue
            ctx = out.get(e.row.context) or ContextBacklog.empty(e.row.context)
            parked = e.parked_reason is not None
            oldest = ctx.oldest_at
            if not e.held and not parked:
                since = max(e.row.occurred_at, e.row.deliver_at or e.row.occurred_at)
                oldest = since if oldest is None else min(oldest, since)
            out[e.row.context] = replace(ctx, 
                count=ctx.count + (not e.held and not parked), oldest_at=oldest,
                failing=ctx.failing + (e.publish_error is not None and not parked),
                delayed=ctx.delayed + e.held, parked=ctx.parked + parked)
        return [out[name] for name in sorted(out)]

    async def purge(self, older_than_seconds: float, batch: int = 5000) -> Purged:
        edge = now() - timedelta(seconds=older_than_seconds)
        old = [row_id for row_id, e in self.entries.items() if e.published_at is not None and e.published_at < edge]
        for row_id in old:
            del self.entries[row_id]
        return Purged(deleted=len(old))

    def _parked(self, context: str | None, row_id: uuid.UUID | None) -> list[Entry]:
        return sorted((e for e in self.entries.values() if e.parked_reason is not None and e.published_at is None
                       and context in (None, e.row.context) and row_id in (None, e.row.id)),
                      key=lambda e: e.parked_at or e.created_at)

    async def parked(self, context: str | None, row_id: uuid.UUID | None, limit: int) -> list[ParkedRow]:
        return [ParkedRow(e.row.id, e.row.context, e.row.aggregate_type, e.row.aggregate_id, e.row.event_type,
                          e.row.event_version, e.parked_reason or "", e.parked_at or e.created_at, e.created_at)
                for e in self._parked(context, row_id)[:limit]]

    async def unpark(self, context: str | None, row_id: uuid.UUID | None, to: str | None = None) -> int:
        found = self._parked(context, row_id)
        for e in found:
            e.parked_reason = e.parked_at = e.next_attempt_at = e.publish_error = None
            e.row = e.row._replace(context=to or e.row.context)
        return len(found)

    async def drop_parked(self, context: str | None, row_id: uuid.UUID | None) -> int:
        found = self._parked(context, row_id)
        for e in found:
            del self.entries[e.row.id]
        return len(found)
