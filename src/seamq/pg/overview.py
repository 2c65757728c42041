"""What the console's overview reads from PostgreSQL: the outbox's backlog per context, what was
published and handled in the last minute, the open dead letters, the workers' beats. Indexed
ranges only, so the page answers in milliseconds however large the tables grow (docs/console.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from seamq.pg.sql import query


@dataclass(frozen=True)
class Tables:
    contexts: list[dict[str, Any]]  # the outbox's backlog, one row per context with any
    published: dict[str, int]  # context -> rows published in the last minute
    inbox: dict[str, dict[str, Any]]  # consumer -> its last minute, and its dead letters
    processes: list[dict[str, Any]]


async def read(pool: AsyncConnectionPool) -> Tables:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("outbox_backlog"))
        contexts = await cur.fetchall()
        await cur.execute(query("console_published"))
        published = {r["context"]: r["published"] for r in await cur.fetchall()}
        await cur.execute(query("console_inbox"))
        inbox = {r["consumer"]: r for r in await cur.fetchall()}
        await cur.execute(query("console_processes"))
        return Tables(contexts, published, inbox, await cur.fetchall())
