"""Dead letters in PostgreSQL: replay scheduling (REQ-059) and the rows people list.

The inbox row of a dead-lettered message holds its state in `dlq_metadata`:
reason, dlq_subject/dlq_seq (where the DLQ copy is), replay_attempts,
next_replay_at, last_reason. The original message itself is read back from
the DLQ stream when it is replayed.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from seamq.model import ReplayPolicy
from seamq.pg.sql import query


@dataclass(frozen=True)
class DlqFilter:
    consumer: str | None = None
    context: str | None = None
    event_type: str | None = None
    reason: str | None = None
    older_than: float | None = None
    ids: list[uuid.UUID] | None = None
    prefix: str | None = None  # of a message id, as `dlq list` shows it cut
    purged: bool = False  # purged ones too (their DLQ copy is gone; the row stays to deduplicate)
    limit: int = 1000

    def params(self) -> dict:
        return dict(consumer=self.consumer, context=self.context, event_type=self.event_type,
                    reason=self.reason, older_than=self.older_than, ids=self.ids, prefix=self.prefix,
                    purged=self.purged, limit=self.limit)


async def schedule(conn: AsyncConnection, policy: ReplayPolicy) -> None:
    """Mark exhausted what is out of replays; give a replay time to what is not."""
    reasons = list(policy.reasons)
    await conn.execute(query("replay_exhaust"), dict(reasons=reasons, max_attempts=policy.max_attempts))
    await conn.execute(query("replay_schedule"), dict(
        reasons=reasons, max_attempts=policy.max_attempts, max_delay=policy.max_delay,
        base=policy.base, factor=policy.factor, jitter=policy.jitter,
    ))


async def due(conn: AsyncConnection, limit: int = 100) -> list[dict]:
    """Dead letters whose replay time has come, locked for this transaction."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("replay_due"), dict(limit=limit))
        return await cur.fetchall()


async def mark_replayed(conn: AsyncConnection, consumer: str, message_id: uuid.UUID, watchdog: float) -> None:
    await conn.execute(query("replay_mark"), dict(consumer=consumer, message_id=message_id, watchdog=watchdog))


async def select(conn: AsyncConnection, selection: DlqFilter) -> list[dict]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("dlq_select"), selection.params())
        return await cur.fetchall()


async def with_attempts(conn: AsyncConnection, rows: list[dict]) -> list[dict]:
    """Inbox rows with each one's failed attempts, oldest first (attempt, failed_at, error)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        for row in rows:
            await cur.execute(query("inbox_attempts"), dict(consumer=row["consumer"], id=row["message_id"]))
            row["failed_attempts"] = await cur.fetchall()
    return rows


async def inbox_rows(conn: AsyncConnection, prefix: str) -> list[dict]:
    """Inbox rows, in any state, whose message id starts with `prefix`."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("inbox_show"), dict(prefix=prefix))
        return await cur.fetchall()


async def mark_purged(conn: AsyncConnection, consumer: str, message_id: uuid.UUID) -> None:
    await conn.execute(query("dlq_purged"), dict(consumer=consumer, message_id=message_id))


class PgDeadLetters:
    """The DeadLetterRepository port on a pool: one transaction per step of a replay round."""

    def __init__(self, pool) -> None:
        self.pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    schedule = staticmethod(schedule)
    due = staticmethod(due)
    mark_replayed = staticmethod(mark_replayed)
