"""One statement's work on a connection of its own, for a command.

The CLI's commands run one repository function each (list dead letters, show
a message, purge a window) and need no pool. `alone(dsn, fn, ...)` opens a
connection, runs `fn(conn, ...)` and closes it, so a command names the
function it wants and never holds a driver's connection itself.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

from psycopg import AsyncConnection

T = TypeVar("T")


async def alone(dsn: str, fn: Callable[..., Awaitable[T]], *args: Any, timeout: int | None = None) -> T:
    """`timeout`: seconds to wait for the connection (libpq's connect_timeout)."""
    async with await AsyncConnection.connect(dsn, autocommit=True, connect_timeout=timeout) as conn:
        return await fn(conn, *args)


async def answers(conn: AsyncConnection) -> None:
    """The server answers a statement: `alone(dsn, answers)` checks a database is there."""
    await conn.execute("SELECT 1")
