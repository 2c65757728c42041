"""The relay's wake-up: LISTEN for the outbox trigger's NOTIFY, which producers send only while a relay
sleeps (migration 0002 says why and how).

Two sessions: one LISTENs (psycopg holds a connection while it waits for
notifications), one holds the relay's sleep registration, an advisory lock
that goes away with its session. Losing either sets `wake`, since rows may
have come in unannounced.
"""

from __future__ import annotations

import asyncio

import psycopg

from seamq.observability import log
from seamq.pg.sql import query
from seamq.ports import Sleep
from seamq.backoff import NO_JITTER, Away, Backoff
from seamq.stopping import sleep_unless_stopped


class PgWakeup:
    """OutboxWakeup over PostgreSQL: `listen` runs beside the relay; `asleep`/`awake` from its loops."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.wake = asyncio.Event()
        self._listening = False  # only then would a NOTIFY be heard
        self._session: psycopg.AsyncConnection | None = None
        self._registered = False
        self._lock = asyncio.Lock()  # the advisory lock is re-entrant: take it once, give it back once

    async def listen(self, stop: asyncio.Event) -> None:
        """LISTEN on its own connection until `stop`; every NOTIFY sets `wake`. Reconnects forever."""
        away = Away(Backoff(base=0.1, cap=5.0, spread=NO_JITTER))
        while not stop.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    await conn.execute("LISTEN seamq_outbox")
                    self._listening = True
                    away.back()
                    self.wake.set()  # rows may have arrived while we were away
                    while not stop.is_set():
                        async for _ in conn.notifies(timeout=1.0):
                            self.wake.set()
            except psycopg.Error as exc:
                log.info("relay_listen_reconnecting", error=str(exc))
                self._listening = False
                await self._forget()  # a server that went away took the registration too
                await sleep_unless_stopped(stop, away.next())
            finally:
                self._listening = False

    async def asleep(self) -> Sleep:
        async with self._lock:
            if self._registered:
                return Sleep.COVERED
            if not self._listening:
                return Sleep.UNCOVERED
            try:
                if self._session is None or self._session.closed:
                    self._session = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                state = Sleep((await (await self._session.execute(query("wake_register"))).fetchone())[0])
            except psycopg.Error as exc:
                log.info("relay_wake_register_failed", error=str(exc))
                await self._drop()
                return Sleep.UNCOVERED
            self._registered = state is Sleep.REGISTERED
            return state

    async def awake(self) -> None:
        if not self._registered:  # read without the lock: the common case costs nothing
            return
        async with self._lock:
            if not self._registered:
                return
            self._registered = False
            try:
                await self._session.execute(query("wake_unregister"))
            except psycopg.Error:
                await self._drop()  # the lock went with the session

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _forget(self) -> None:
        async with self._lock:
            await self._drop()
        self.wake.set()

    async def _drop(self) -> None:
        self._registered = False
        if self._session is not None:
            session, self._session = self._session, None
            try:
                await session.close()
            except psycopg.Error:
                pass
