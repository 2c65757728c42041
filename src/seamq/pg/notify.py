"""The relay's wake-up: PostgreSQL NOTIFY on `seamq_outbox` (sent by the outbox trigger at commit)."""

from __future__ import annotations

import asyncio

import psycopg

from seamq.observability import log
from seamq.stopping import sleep_unless_stopped


async def listen_for_outbox(dsn: str, wake: asyncio.Event, stop: asyncio.Event) -> None:
    """LISTEN on its own connection; every NOTIFY wakes the relay. Reconnects forever."""
    backoff = 0.1
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("LISTEN seamq_outbox")
                backoff = 0.1
                wake.set()  # rows may have arrived while we were away
                while not stop.is_set():
                    async for _ in conn.notifies(timeout=1.0):
                        wake.set()
        except psycopg.Error as exc:
            log.info("relay_listen_reconnecting", error=str(exc))
            await sleep_unless_stopped(stop, backoff)
            backoff = min(5.0, backoff * 2)
