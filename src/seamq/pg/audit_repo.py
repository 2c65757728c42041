"""The audit's reads and marks in PostgreSQL (the AuditStore port): one named query per method."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from seamq.pg.sql import query
from seamq.ports import Finding, OutboxRow, PublishedRow, Walked

ZERO = uuid.UUID(int=0)


class PgAuditStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def _rows(self, name: str, params: dict) -> list[tuple]:
        async with self.pool.connection() as conn:
            return await (await conn.execute(query(name), params)).fetchall()

    async def now(self) -> datetime:
        return (await self._rows("audit_now", {}))[0][0]

    async def cursor(self, walk: str) -> Walked | None:
        rows = await self._rows("audit_cursor", {"walk": walk})
        return Walked(*rows[0]) if rows else None

    async def save_cursor(self, walk: str, at: Walked) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(query("audit_cursor_save"), {"walk": walk, "at": at.at, "id": at.id, "seq": at.seq})

    async def published(self, context: str, after: Walked, settle: float, limit: int) -> list[PublishedRow]:
        return [PublishedRow(*row) for row in await self._rows("audit_published", {
            "context": context, "at": after.at, "id": after.id or ZERO, "settle": settle, "limit": limit})]

    async def outbox_has(self, ids: list[uuid.UUID]) -> set[uuid.UUID]:
        return {row[0] for row in await self._rows("audit_outbox_has", {"ids": ids})} if ids else set()

    async def outbox_rows(self, ids: list[uuid.UUID]) -> list[OutboxRow]:
        return [OutboxRow(*row) for row in await self._rows("audit_outbox_rows", {"ids": ids})] if ids else []

    async def inbox_done(self, consumer: str, ids: list[uuid.UUID]) -> set[uuid.UUID]:
        if not ids:
            return set()
        return {row[0] for row in await self._rows("audit_inbox_done", {"consumer": consumer, "ids": ids})}

    async def found(self, findings: list[Finding]) -> set[uuid.UUID]:
        if not findings:
            return set()
        text = json.dumps([{**f._asdict(), "message_id": str(f.message_id)} for f in findings])
        return {row[0] for row in await self._rows("audit_found", {"findings": text})}

    async def unrepaired(self, context: str, limit: int) -> list[uuid.UUID]:
        return [row[0] for row in await self._rows("audit_unrepaired", {"context": context, "limit": limit})]

    async def repaired(self, context: str, ids: list[uuid.UUID], seqs: list[int]) -> None:
        if ids:
            async with self.pool.connection() as conn:
                await conn.execute(query("audit_repaired"), {"context": context, "ids": ids, "seqs": seqs})

    # What the console and `seamq audit --once` show.

    async def summary(self) -> list[tuple]:
        """(kind, scope, found, repaired) for every kind and scope ever found."""
        return await self._rows("audit_findings_count", {})

    async def latest(self, since: datetime, limit: int) -> list[tuple]:
        return await self._rows("audit_findings", {"since": since, "limit": limit})

    async def walks(self) -> list[tuple]:
        """(walk, at, seq, updated_at): where each walk has got to, and when it last moved."""
        return await self._rows("audit_walks", {})
