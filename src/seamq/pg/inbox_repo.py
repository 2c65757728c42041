"""PostgreSQL implementation of the InboxRepository port (PORT-047-002).

A lane's unit of work is one transaction from `transaction()`: the inbox
rows, an in-process handler's writes (through the same connection) and the
marks commit together. Round trips per lane: the insert, the lock of rows
seen before (when there are any), and one record statement (when anything
differs from "handled").
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator

from psycopg import AsyncConnection, Rollback
from psycopg_pool import AsyncConnectionPool

from seamq import codec
from seamq.pg import partitions
from seamq.pg.errors import database_away
from seamq.pg.sql import query
from seamq.ports import Admission, InboxItem, InboxOutcome
from seamq.tables import ConsumerBacklog, Purged


async def consumer_session(conn: AsyncConnection) -> None:
    """Consumer connections (a pool `configure`) plan each statement for its
    parameters. psycopg prepares a statement after 5 runs, and PostgreSQL may
    then settle on a generic plan; one settled on while the inbox is young
    stays as it grows. Measured at 2k events/s: inbox lookups through a bitmap
    scan of every row of the consumer (24M index entries read in 10 s), p99
    commit -> handler 66 ms; 44 ms with custom plans. Only a planner setting:
    a handler's own statements on the connection lose nothing but plan reuse.
    """
    await conn.execute("SET plan_cache_mode = force_custom_plan")
    await conn.commit()


class PgInbox:
    """The inbox of one consumer. New rows are inserted already marked processed, since nearly all
    will be by the commit and nobody sees the mark before it (inbox_insert: one write per message
    instead of two); `record` puts back the few that were not, in the same single statement that
    marks everything else."""

    def __init__(self, consumer: str, pool: AsyncConnectionPool) -> None:
        self.consumer = consumer
        self.pool = pool

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        return database_away(exc)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["PgLaneWork"]:
        async with self.pool.connection() as conn, lane_transaction(conn) as work:
            yield work

    async def admit(self, work: "PgLaneWork", items: list[InboxItem]) -> dict[uuid.UUID, tuple[Admission, int]]:
        work.admissions = admitted = await self._admit(work.conn, items)
        return admitted

    async def _admit(self, conn: AsyncConnection, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Admission, int]]:
        if not items:
            return {}
        texts = [str(i.message_id) for i in items]
        by_text = {text: i.message_id for text, i in zip(texts, items)}
        rows = codec.dumps([
            [text, i.subject, i.event_type, i.event_version, i.occurred_at.isoformat() if i.occurred_at else None,
             i.deliver_at.isoformat() if i.deliver_at else None]
            for text, i in zip(texts, items)
        ]).decode()
        cur = await conn.execute(query("inbox_insert"), dict(consumer=self.consumer, items=rows))
        admitted = {by_text[text]: (Admission.NEW, 0) for (text,) in await cur.fetchall()}
        existing = [i for i in items if i.message_id not in admitted]
        if not existing:
            return admitted
        replays = {i.message_id for i in existing if i.replay}
        ids = list(dict.fromkeys(i.message_id for i in existing))  # copies of one message: one row
        cur = await conn.execute(query("inbox_lock"), dict(consumer=self.consumer, ids=ids))
        replayed, duplicates = [], []
        for message_id, status, attempts in await cur.fetchall():
            if status == "received":
                admitted[message_id] = (Admission.RETRY, attempts)
            elif status in ("dead_lettered", "exhausted") and message_id in replays:
                admitted[message_id] = (Admission.REPLAY, 0)
                replayed.append(message_id)
            else:
                admitted[message_id] = (Admission.DUPLICATE, attempts)
                if message_id not in replays:  # a replay reaching a consumer that had succeeded is no failure
                    duplicates.append(message_id)
        if replayed:
            await conn.execute(query("inbox_replay"), dict(consumer=self.consumer, ids=replayed))
        if duplicates:
            await conn.execute(query("inbox_duplicate"), dict(consumer=self.consumer, ids=duplicates))
        return admitted

    async def record(self, work: "PgLaneWork", outcomes: list[InboxOutcome]) -> None:
        """One statement for the rows that change; none on the fast path (every new row handled)."""
        rows = []
        for o in outcomes:
            new = work.admissions.get(o.message_id, (Admission.NEW, 0))[0] == Admission.NEW
            dead = o.dead_letter
            # A failed attempt goes to the history: a handler's failure, or its dead letter.
            failed = (dead.detail if dead else o.error) if o.attempted and not o.done else None
            row = {"id": str(o.message_id), "copies": o.copies, "attempts": o.attempts,
                   "failed": _text(failed) if failed else None}
            if dead is not None:
                rows.append({**row, "state": "dead_lettered", "reason": dead.reason, "detail": _text(dead.detail),
                             "dlq_subject": dead.dlq_subject, "dlq_seq": dead.dlq_seq})
                continue
            if o.done:  # a new row went in as processed, with one attempt
                state = "keep" if new and o.attempts == 1 else "processed"
            elif o.error is not None or new:
                state = "received"  # failed (with its error), or a new row held back
            else:
                state = "keep"  # a duplicate, or a row already received held back
            if state != "keep" or o.copies:
                rows.append({**row, "state": state, "error": _text(o.error) if o.error else None})
        if rows:
            await work.conn.execute(query("inbox_record"), dict(consumer=self.consumer, rows=codec.dumps(rows).decode()))

    async def failed_alone(self, item: InboxItem, error: str) -> int:
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(query("inbox_failed_alone"), dict(
                consumer=self.consumer, id=item.message_id, subject=item.subject, event_type=item.event_type,
                event_version=item.event_version, occurred_at=item.occurred_at, deliver_at=item.deliver_at,
                error=_text(error)))
            return (await cur.fetchone())[0]


@asynccontextmanager
async def lane_transaction(conn: AsyncConnection) -> AsyncIterator["PgLaneWork"]:
    """A lane's unit of work on `conn`: it commits when it ends, unless it was abandoned."""
    async with conn.transaction():
        work = PgLaneWork(conn)
        yield work
        if work.abandoned:
            raise Rollback()  # psycopg's way out of a transaction block: rolled back, no error


class PgLaneWork:
    """A lane's transaction: handlers write through `conn`; one savepoint at a time around a handler."""

    __slots__ = ("conn", "admissions", "abandoned")

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.admissions: dict[uuid.UUID, tuple[Admission, int]] = {}
        self.abandoned = False

    async def savepoint(self) -> None:
        await self.conn.execute("SAVEPOINT seamq_handler", prepare=False)

    async def release(self) -> None:
        await self.conn.execute("RELEASE SAVEPOINT seamq_handler", prepare=False)

    async def undo(self) -> None:
        """Also what ends a failed statement's error state: the lane's own statements go on."""
        await self.conn.execute("ROLLBACK TO SAVEPOINT seamq_handler", prepare=False)

    def abandon(self) -> None:
        self.abandoned = True


def _text(value: str) -> str:
    """PostgreSQL text cannot hold NUL; an error text quoting a hostile message or response may."""
    return value.replace("\x00", "\\0") if "\x00" in value else value


class PgInboxTables:
    """The InboxTables port: every consumer's rows, for people (`seamq backlog`, `seamq inbox purge`)."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def backlog(self) -> list[ConsumerBacklog]:
        async with self.pool.connection() as conn:
            return [ConsumerBacklog._make(row) for row in await (await conn.execute(query("inbox_backlog"))).fetchall()]

    async def purge(self, older_than_seconds: float, batch: int = 5000) -> Purged:
        """Processed rows older than the window: whole partitions dropped, the legacy and default
        partitions' rows deleted in bounded batches (seamq.pg.partitions)."""
        return await partitions.purged(self.pool.conninfo, "inbox_messages", older_than_seconds, batch)
