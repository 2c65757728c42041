"""Readiness check on the database side (seamq.health.Check): does PostgreSQL answer?

One connection of its own, kept between probes (a probe every few seconds
should not cost a connection each) and replaced when a restart broke it.
"""

from __future__ import annotations

import psycopg


class PgPing:
    def __init__(self, dsn: str, timeout: float = 2.0) -> None:
        self._dsn, self._timeout = dsn, timeout
        self._conn: psycopg.AsyncConnection | None = None

    async def __call__(self) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout)))
            await self._conn.execute("SELECT 1")
        except psycopg.Error as exc:
            await self.close()
            raise ConnectionError(f"PostgreSQL does not answer: {type(exc).__name__}") from None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
