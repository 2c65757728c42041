"""PostgreSQL implementation of the InboxRepository port (PORT-047-002).

Every method runs on the caller's connection, inside the consumer's
transaction, so an in-process handler's writes and the inbox marks commit
together.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import PoolTimeout

from seamq.pg.sql import query
from seamq.ports import Claim, InboxItem


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
    def __init__(self, consumer: str) -> None:
        self.consumer = consumer

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        """Does this failure say the database is away (every message waits), rather than
        something about the messages at hand?"""
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))

    async def claim(self, conn: AsyncConnection, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Claim, int]]:
        """Record the items; returns, per message id, what to do with it and its attempt number.

        New rows go in marked processed (see inbox_insert): the caller reverts
        those that were not with `not_processed`, before its commit.
        """
        if not items:
            return {}
        texts = [str(i.message_id) for i in items]
        by_text = {text: i.message_id for text, i in zip(texts, items)}
        rows = json.dumps([
            [text, i.subject, i.event_type, i.event_version, i.occurred_at.isoformat() if i.occurred_at else None]
            for text, i in zip(texts, items)
        ])
        cur = await conn.execute(query("inbox_insert"), dict(consumer=self.consumer, items=rows))
        claims = {by_text[text]: (Claim.NEW, 1) for (text,) in await cur.fetchall()}
        existing = [i for i in items if i.message_id not in claims]
        if not existing:
            return claims
        replays = {i.message_id for i in existing if i.replay}
        cur = await conn.execute(query("inbox_lock"), dict(consumer=self.consumer, ids=[i.message_id for i in existing]))
        again, duplicates = [], []
        for message_id, status, attempts in await cur.fetchall():
            if status == "received":
                claims[message_id] = (Claim.RETRY, attempts + 1)
            elif status in ("dead_lettered", "exhausted") and message_id in replays:
                claims[message_id] = (Claim.REPLAY, attempts + 1)
            else:
                claims[message_id] = (Claim.DUPLICATE, attempts)
                if message_id not in replays:  # a replay reaching a consumer that had succeeded is no failure
                    duplicates.append(message_id)
                continue
            again.append(message_id)
        if again:
            await conn.execute(query("inbox_retry"), dict(consumer=self.consumer, ids=again))
        if duplicates:
            await conn.execute(query("inbox_duplicate"), dict(consumer=self.consumer, ids=duplicates))
        return claims

    async def processed(self, conn: AsyncConnection, ids: list[uuid.UUID]) -> None:
        if ids:
            await conn.execute(query("inbox_processed"), dict(consumer=self.consumer, ids=ids))

    async def not_processed(self, conn: AsyncConnection, ids: list[uuid.UUID]) -> None:
        if ids:
            await conn.execute(query("inbox_not_processed"), dict(consumer=self.consumer, ids=ids))

    async def duplicate(self, conn: AsyncConnection, ids: list[uuid.UUID]) -> None:
        if ids:
            await conn.execute(query("inbox_duplicate"), dict(consumer=self.consumer, ids=ids))

    async def failed(self, conn: AsyncConnection, ids: list[uuid.UUID], errors: list[str]) -> None:
        if ids:
            await conn.execute(query("inbox_failed"), dict(consumer=self.consumer, ids=ids, errors=_texts(errors)))

    async def dead_lettered(
        self, conn: AsyncConnection, ids: list[uuid.UUID], reasons: list[str], details: list[str],
        dlq_subjects: list[str], dlq_seqs: list[int | None],
    ) -> None:
        if ids:
            await conn.execute(query("inbox_dead_lettered"), dict(
                consumer=self.consumer, ids=ids, reasons=reasons, details=_texts(details),
                dlq_subjects=dlq_subjects, dlq_seqs=dlq_seqs,
            ))


def _texts(values: list[str]) -> list[str]:
    """PostgreSQL text cannot hold NUL; an error text quoting a hostile message or response may."""
    return [v.replace("\x00", "\\0") if "\x00" in v else v for v in values]


async def purge_inbox(conn: AsyncConnection, older_than_seconds: float, batch: int = 5000) -> int:
    """Delete processed rows older than the window, in bounded batches (autocommit connection)."""
    total = 0
    while True:
        cur = await conn.execute(query("purge_inbox"), dict(older_than=older_than_seconds, batch=batch))
        total += cur.rowcount
        if cur.rowcount < batch:
            return total


class NoInbox:
    """At-least-once mode (`consumer.inbox: false`): nothing recorded, every delivery handled.

    For handlers that are idempotent on their own, and for measuring what the
    inbox costs. No exactly-once guarantee comes from seamq in this mode.
    """

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        return False

    async def claim(self, conn, items: list[InboxItem]) -> dict[uuid.UUID, tuple[Claim, int]]:
        return {}

    async def processed(self, conn, ids) -> None: ...

    async def not_processed(self, conn, ids) -> None: ...

    async def duplicate(self, conn, ids) -> None: ...

    async def failed(self, conn, ids, errors) -> None: ...

    async def dead_lettered(self, conn, ids, reasons, details, dlq_subjects, dlq_seqs) -> None: ...
