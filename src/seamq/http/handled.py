"""Exactly-once side effects for a handler service behind HTTP, in the service's own database.

The consumer's inbox is in the consumer's database; a handler behind HTTP writes to its own. When a
call times out, the consumer cannot tell whether the handler is still running, so it sends the
message again: without a record on the handler's side the work runs twice, even twice at once (an
outside check billed one order five times, then a sixth on replay). `Handled` keeps that record in
the handler's database, in the transaction the handler's writes go through:

- a message already handled (by this consumer) is answered 409 and does not run again;
- one another request is still handling is answered 423 (the consumer sends it again later, and
  counts no attempt), and does not run alongside;
- the handler's writes and the record commit together, or neither does: a failed run leaves no
  record, so the redelivery runs it again.

The record is a row per (consumer, message id) in `seamq_handled`, created when the service first
needs it. Keep rows at least as long as a copy can still arrive (docs/operations.md, "Retention":
the same floor as the inbox); `purge` deletes older ones.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager
from enum import Enum
from typing import Any, AsyncIterator

SCHEMA = """
CREATE TABLE IF NOT EXISTS seamq_handled (
  consumer TEXT NOT NULL,
  message_id UUID NOT NULL,
  handled_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS idx_seamq_handled_at ON seamq_handled (handled_at)
"""
# Held to the end of the handling transaction: a second request for the same message finds it taken.
_TAKE = "SELECT pg_try_advisory_xact_lock(7107, hashtext(%(consumer)s || '/' || %(message_id)s))"
_RECORD = """INSERT INTO seamq_handled (consumer, message_id) VALUES (%(consumer)s, %(message_id)s)
ON CONFLICT DO NOTHING RETURNING 1"""
_PURGE = "DELETE FROM seamq_handled WHERE handled_at < now() - %(seconds)s * interval '1 second'"


class Claim(Enum):
    NEW = "new"  # run it: its record is written in this transaction
    DONE = "done"  # handled before: 409
    BUSY = "busy"  # another request is handling it now: 423, try later


class Handled:
    def __init__(self, database_url: str, *, pool_size: int = 10) -> None:
        self.database_url, self.pool_size = database_url, pool_size
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _ready(self):
        async with self._opening:
            if self._pool is None:
                from psycopg_pool import AsyncConnectionPool

                pool = AsyncConnectionPool(self.database_url, min_size=1, max_size=self.pool_size, open=False)
                await pool.open(wait=True, timeout=10)
                async with pool.connection() as conn:
                    await conn.execute(SCHEMA)
                self._pool = pool
        return self._pool

    @asynccontextmanager
    async def claim(self, consumer: str, message_id: uuid.UUID) -> AsyncIterator[tuple[Claim, Any]]:
        """The message's claim and the connection whose transaction the handler writes through.
        An exception out of the block rolls the transaction back, the record with it."""
        pool = await self._ready()
        key = dict(consumer=consumer, message_id=str(message_id))
        async with pool.connection() as conn, conn.transaction():
            taken = (await (await conn.execute(_TAKE, key)).fetchone())[0]
            if not taken:
                yield Claim.BUSY, conn
                return
            recorded = await (await conn.execute(_RECORD, key)).fetchone()
            yield (Claim.NEW if recorded else Claim.DONE), conn

    async def purge(self, older_than_seconds: float) -> int:
        """Delete records older than the window; how many."""
        pool = await self._ready()
        async with pool.connection() as conn:
            return (await conn.execute(_PURGE, dict(seconds=older_than_seconds))).rowcount

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
