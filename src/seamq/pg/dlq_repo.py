"""Dead letters in PostgreSQL: replay scheduling (REQ-059) and the rows people list.

The inbox row of a dead-lettered message holds its state in `dlq_metadata`:
reason, dlq_subject/dlq_seq (where the DLQ copy is), replay_attempts,
next_replay_at, last_reason. The original message itself is read back from
the DLQ stream when it is replayed.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import AsyncIterator

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from seamq.dead_letter import ReplayPolicy
from seamq.model import CONSUMER_SEPARATOR
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
    purged: bool = False  # closed ones too: purged (the row stays to deduplicate), or edited and replayed
    since: datetime | None = None  # received at or after
    until: datetime | None = None  # received before
    text: str | None = None  # in the last error, any case
    cause: str | None = None  # as grouped (seamq_dlq_cause, migration 0008)
    limit: int = 1000

    def params(self) -> dict:
        return {**{field.name: getattr(self, field.name) for field in fields(self)}, "separator": CONSUMER_SEPARATOR}


async def schedule(conn: AsyncConnection, policy: ReplayPolicy) -> None:
    """Mark exhausted what is out of replays; give a replay time to what is not."""
    reasons = list(policy.reasons)
    await conn.execute(query("replay_exhaust"), dict(reasons=reasons, max_attempts=policy.max_attempts))
    rows = await (await conn.execute(query("replay_unscheduled"),
                                     dict(reasons=reasons, max_attempts=policy.max_attempts))).fetchall()
    if rows:
        consumers, ids, parts, attempts = zip(*rows)
        await conn.execute(query("replay_schedule"), dict(
            consumers=list(consumers), ids=list(ids), parts=list(parts),
            delays=[policy.delay(n) for n in attempts]))


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


async def groups(conn: AsyncConnection, selection: DlqFilter) -> list[dict]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("dlq_groups"), selection.params())
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


async def mark_edited(conn: AsyncConnection, consumer: str, message_id: uuid.UUID, new_id: uuid.UUID,
                      actor: str) -> bool:
    cur = await conn.execute(query("dlq_edited"), dict(consumer=consumer, message_id=message_id, new_id=str(new_id),
                                                       actor=actor))
    return cur.rowcount == 1


async def start_action(conn: AsyncConnection, actor: str, action: str, message_ids: list[uuid.UUID],
                       detail: dict) -> int:
    cur = await conn.execute(query("action_start"), dict(actor=actor, action=action, selected=len(message_ids),
                                                         message_ids=message_ids, detail=Jsonb(detail)))
    return (await cur.fetchone())[0]


async def finish_action(conn: AsyncConnection, action_id: int, done: int, detail: dict) -> None:
    await conn.execute(query("action_finish"), dict(id=action_id, done=done, detail=Jsonb(detail)))


async def actions(conn: AsyncConnection, limit: int = 100, message_id: uuid.UUID | None = None) -> list[dict]:
    async with conn.cursor(row_factory=dict_row) as cur:
        if message_id is None:
            await cur.execute(query("actions_recent"), dict(limit=limit))
        else:
            await cur.execute(query("actions_of_message"), dict(id=message_id))
        return await cur.fetchall()


class PgDeadLetters:
    """The DeadLetterRepository port on a pool: one transaction per step of a replay round or of an action."""

    def __init__(self, pool) -> None:
        self.pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    schedule = staticmethod(schedule)
    due = staticmethod(due)
    mark_replayed = staticmethod(mark_replayed)
    select = staticmethod(select)
    groups = staticmethod(groups)
    with_attempts = staticmethod(with_attempts)
    mark_purged = staticmethod(mark_purged)
    mark_edited = staticmethod(mark_edited)
    start_action = staticmethod(start_action)
    finish_action = staticmethod(finish_action)
    actions = staticmethod(actions)
