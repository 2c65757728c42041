"""What makes a migration's own transaction take milliseconds on an install with rows, done before
it without stopping writers: a column added without a rewrite, a constraint validated and indexes
built concurrently (`seamq db upgrade` runs it when the migration is next).

Migration 0013 would otherwise build the new keys of every existing outbox and inbox row inside
its transaction, holding both tables for as long. Each step may be cut short (kill -9 included)
and run again: a column or constraint already there is kept, an index a cut-short build left
invalid is dropped and built again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

import psycopg

LOCK_TIMEOUT = "500ms"
ONLINE_LOCK = (7103, 1)  # one upgrader's online steps at a time


@dataclass(frozen=True)
class Step:
    what: str
    sql: str
    index: str | None = None  # a concurrent index build: its name, for leftovers and progress


def _steps_0013() -> list[Step]:
    steps = [Step(f"{t}: a time column (no rewrite)",
                  f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS part timestamptz NOT NULL DEFAULT 'epoch'")
             for t in ("outbox_events", "inbox_messages", "inbox_attempts")]
    for table in ("outbox_events", "inbox_messages", "inbox_attempts"):
        name = f"{table}_legacy_is_epoch"
        steps += [
            Step(f"{table}: every row dated 1970 (constraint)", f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_constraint "
                 f"WHERE conname = '{name}') THEN ALTER TABLE {table} ADD CONSTRAINT {name} CHECK (part = 'epoch') "
                 "NOT VALID; END IF; END $$"),
            Step(f"{table}: every row dated 1970 (validated, reading the table)",
                 f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}"),
        ]
    return steps + [
        Step("outbox_events: the new key", "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_key_by_time "
             "ON outbox_events (id, part)", "outbox_events_key_by_time"),
        Step("inbox_messages: the new key", "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_key_by_time "
             "ON inbox_messages (consumer, message_id, part)", "inbox_messages_key_by_time"),
        Step("inbox_messages: receipt times", "CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_inbox_received_brin ON "
             "inbox_messages USING brin (received_at) WITH (pages_per_range = 32, autosummarize = on)",
             "idx_inbox_received_brin"),
    ]


STEPS = {13: _steps_0013}


async def prepare(dsn: str, version: int, progress: Callable[[str], None]) -> None:
    """Run `version`'s online steps (none for most migrations), saying what each does."""
    if version not in STEPS:
        return
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s, %s)", ONLINE_LOCK)
        for step in STEPS[version]():
            progress(f"{version:04d}: {step.what}")
            if step.index:
                await _drop_invalid(conn, step.index)
                watcher = asyncio.create_task(_watch(dsn, step.index, progress))
                try:
                    await conn.execute(step.sql)
                finally:
                    watcher.cancel()
            else:
                await _short(conn, step.sql)


async def _short(conn: psycopg.AsyncConnection, statement: str) -> None:
    """A statement that takes a table's lock for a moment: never queued for long behind a
    long query (which would queue every writer behind it); tried again until it has it."""
    while True:
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                await conn.execute(statement)
            return
        except psycopg.errors.LockNotAvailable:
            await asyncio.sleep(1)


async def _drop_invalid(conn: psycopg.AsyncConnection, index: str) -> None:
    row = await (await conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                    (index,))).fetchone()
    if row and not row[0]:  # a build cut short left it: built again
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}")


async def _watch(dsn: str, index: str, progress: Callable[[str], None], every: float = 5.0) -> None:
    """The build's progress, as PostgreSQL reports it, every few seconds."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            await asyncio.sleep(every)
            row = await (await conn.execute(
                "SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total FROM pg_stat_progress_create_index "
                "WHERE datname = current_database() AND command = 'CREATE INDEX CONCURRENTLY'")).fetchone()
            if row:
                phase, blocks_done, blocks_total, tuples_done, tuples_total = row
                share = (blocks_done / blocks_total if blocks_total else
                         tuples_done / tuples_total if tuples_total else 0.0)
                progress(f"  {index}: {phase}, {share:.0%}")
