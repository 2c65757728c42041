"""Dead letters in PostgreSQL: replay scheduling (REQ-059) and the rows people list.

The inbox row of a dead-lettered message holds its state in `dlq_metadata`:
reason, dlq_subject/dlq_seq (where the DLQ copy is), replay_attempts,
next_replay_at, last_reason. The original message itself is read back from
the DLQ stream when it is replayed. Rows leave here typed (seamq.dead_letter:
`DeadLetterRow` with its `State`), built in one place, `_row`.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from dataclasses import fields, replace
from typing import Any, AsyncIterator, Mapping

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from seamq.dead_letter import Action, DeadLetterRow, DlqFilter, FailedAttempt, Group, ReplayPolicy, State
from seamq.model import CONSUMER_SEPARATOR
from seamq.pg.sql import query

_COLUMNS = frozenset(f.name for f in fields(DeadLetterRow)) - {"state"}


def params(selection: DlqFilter) -> dict[str, Any]:
    """A selection as dlq_where reads it."""
    return {**{f.name: getattr(selection, f.name) for f in fields(selection)}, "separator": CONSUMER_SEPARATOR}


def _row(record: Mapping[str, Any]) -> DeadLetterRow:
    return DeadLetterRow(state=State.of(record.get("dlq_metadata")),
                         **{k: v for k, v in record.items() if k in _COLUMNS and v is not None})


async def _rows(conn: AsyncConnection, name: str, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query(name), values)
        return await cur.fetchall()


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


async def due(conn: AsyncConnection, limit: int = 100) -> list[DeadLetterRow]:
    """Dead letters whose replay time has come, locked for this transaction."""
    return [_row(r) for r in await _rows(conn, "replay_due", dict(limit=limit))]


async def mark_replayed(conn: AsyncConnection, consumer: str, message_id: uuid.UUID, watchdog: float) -> None:
    await conn.execute(query("replay_mark"), dict(consumer=consumer, message_id=message_id, watchdog=watchdog))


async def select(conn: AsyncConnection, selection: DlqFilter) -> list[DeadLetterRow]:
    return [_row(r) for r in await _rows(conn, "dlq_select", params(selection))]


async def groups(conn: AsyncConnection, selection: DlqFilter) -> list[Group]:
    return [Group(**r) for r in await _rows(conn, "dlq_groups", params(selection))]


async def with_attempts(conn: AsyncConnection, rows: list[DeadLetterRow]) -> list[DeadLetterRow]:
    """Inbox rows with each one's failed attempts, oldest first."""
    out = []
    for row in rows:
        found = await _rows(conn, "inbox_attempts", dict(consumer=row.consumer, id=row.message_id))
        out.append(replace(row, failed_attempts=tuple(FailedAttempt(**a) for a in found)))
    return out


async def inbox_rows(conn: AsyncConnection, prefix: str) -> list[DeadLetterRow]:
    """Inbox rows, in any state, whose message id starts with `prefix`."""
    return [_row(r) for r in await _rows(conn, "inbox_show", dict(prefix=prefix))]


async def mark_purged(conn: AsyncConnection, consumer: str, message_id: uuid.UUID) -> None:
    await conn.execute(query("dlq_purged"), dict(consumer=consumer, message_id=message_id))


async def mark_edited(conn: AsyncConnection, consumer: str, message_id: uuid.UUID, new_id: uuid.UUID,
                      actor: str) -> bool:
    cur = await conn.execute(query("dlq_edited"), dict(consumer=consumer, message_id=message_id, new_id=str(new_id),
                                                       actor=actor))
    return cur.rowcount == 1


async def start_action(conn: AsyncConnection, actor: str, action: str, message_ids: list[uuid.UUID],
                       detail: Mapping[str, object]) -> int:
    cur = await conn.execute(query("action_start"), dict(actor=actor, action=action, selected=len(message_ids),
                                                         message_ids=message_ids, detail=Jsonb(dict(detail))))
    return (await cur.fetchone())[0]  # INSERT ... RETURNING: always one row


async def finish_action(conn: AsyncConnection, action_id: int, done: int, detail: Mapping[str, object]) -> None:
    await conn.execute(query("action_finish"), dict(id=action_id, done=done, detail=Jsonb(dict(detail))))


async def actions(conn: AsyncConnection, limit: int = 100, message_id: uuid.UUID | None = None) -> list[Action]:
    found = (await _rows(conn, "actions_recent", dict(limit=limit)) if message_id is None
             else await _rows(conn, "actions_of_message", dict(id=message_id)))
    return [Action(**r) for r in found]


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
    inbox_rows = staticmethod(inbox_rows)
    mark_purged = staticmethod(mark_purged)
    mark_edited = staticmethod(mark_edited)
    start_action = staticmethod(start_action)
    finish_action = staticmethod(finish_action)
    actions = staticmethod(actions)
