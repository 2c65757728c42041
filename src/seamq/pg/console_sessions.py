"""The console's sessions as PostgreSQL keeps them: one generation per user (migration 0011).

A session cookie carries its user's generation from sign-in; signing out moves it on, so every
cookie of that user, on every console instance sharing the database, stops opening pages.
"""

from __future__ import annotations

from seamq.pg.sql import query


class PgSessions:
    def __init__(self, pool) -> None:
        self.pool = pool

    async def generation(self, user: str) -> int:
        async with self.pool.connection() as conn:
            return (await (await conn.execute(query("console_session_generation"), dict(user=user))).fetchone())[0]

    async def end(self, user: str) -> int:
        """End every session of `user`; the generation new sign-ins get."""
        async with self.pool.connection() as conn:
            return (await (await conn.execute(query("console_sessions_end"), dict(user=user))).fetchone())[0]
