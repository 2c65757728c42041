"""PostgreSQL implementation of the OutboxRepository port (PORT-047-001).

A claim is a transaction: bucket locks and row locks are held while the relay
publishes, and the marks commit together at the end. If the relay dies in
between, the transaction rolls back and the rows are claimed again later;
their Nats-Msg-Id makes the second publish a no-op in JetStream.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from seamq.pg.sql import query
from seamq.ports import OutboxRow

# Advisory lock class for relay buckets (the second key is the bucket).
RELAY_LOCK_CLASS = 7104
BUCKETS = 128


async def relay_session(conn: AsyncConnection) -> None:
    """Planner settings for the relay's own connections (nothing else runs there).

    Every relay statement is an index walk by design: the claim reads the head
    of the pending-seq index in order, marks go by primary key. The planner does
    not always see it: statistics of a young or churning outbox make a bitmap
    scan (which reads every entry, those of rows published since the last
    VACUUM included) or a sequential scan look cheap, and a prepared statement
    keeps such a plan as the table grows. Measured at 2k events/s: 7,300 index
    entries read per claim, 1,000 sequential scans of the outbox in ten seconds,
    PostgreSQL at 74% CPU; with these settings 40% and p99 commit -> handler
    121 -> 34 ms. A plain index scan also marks the entries of published rows
    dead as it passes, so the next claim skips them.
    """
    await conn.execute("SET enable_bitmapscan = off")
    await conn.execute("SET enable_seqscan = off")
    await conn.commit()


@dataclass
class PgClaimedBatch:
    conn: AsyncConnection
    rows: list[OutboxRow]
    more: bool
    base_backoff: float
    max_backoff: float

    async def mark_published(self, ids: list[uuid.UUID], stream_seqs: list[int]) -> None:
        if ids:
            await self.conn.execute(query("mark_published"), dict(ids=ids, seqs=stream_seqs))

    async def mark_failed(self, ids: list[uuid.UUID], errors: list[str], retry_later: list[bool]) -> None:
        if ids:
            await self.conn.execute(
                query("mark_failed"),
                dict(ids=ids, errors=errors, retry_later=retry_later,
                     base_backoff=self.base_backoff, max_backoff=self.max_backoff),
            )


class PgOutbox:
    def __init__(
        self, pool: AsyncConnectionPool, *, buckets_per_claim: int = 16,
        base_backoff: float = 1.0, max_backoff: float = 30.0,
    ) -> None:
        self.pool = pool
        self.buckets_per_claim = buckets_per_claim
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[PgClaimedBatch]:
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                query("claim_buckets"),
                dict(scan=limit * 4, lock_class=RELAY_LOCK_CLASS, buckets=self.buckets_per_claim),
            )
            buckets, more = await cur.fetchone()
            rows = []
            if buckets:
                async with conn.cursor(row_factory=lambda _: OutboxRow._make) as cur:
                    await cur.execute(query("claim_rows"), dict(buckets=buckets, limit=limit))
                    rows = await cur.fetchall()
            yield PgClaimedBatch(conn, rows, more, self.base_backoff, self.max_backoff)

    async def backlog(self) -> list[dict]:
        async with self.pool.connection() as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("outbox_backlog"))
                return await cur.fetchall()

    async def purge(self, older_than_seconds: float, batch: int = 5000) -> int:
        """Delete published rows older than the window, one bounded batch per transaction."""
        total = 0
        while True:
            async with self.pool.connection() as conn:
                cur = await conn.execute(query("purge_outbox"), dict(older_than=older_than_seconds, batch=batch))
                total += cur.rowcount
            if cur.rowcount < batch:
                return total
