"""The write API: the outbox row lives and dies with the caller's transaction, whatever the driver."""

import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from seamq import outbox
from seamq.model import ErrorCode, Event, SeamqError

from helpers import fetch_one, scalar


def make_event(**overrides) -> Event:
    fields = dict(context="sea", aggregate_type="order", aggregate_id="o-1", event_type="order_placed",
                  payload={"total": 42, "items": ["a", "b"]})
    fields.update(overrides)
    return Event(**fields)


class Rollback(Exception):
    pass


def count(dsn, event_id=None):
    if event_id:
        return scalar(dsn, "SELECT count(*) FROM outbox_events WHERE id = %s", (event_id,))
    return scalar(dsn, "SELECT count(*) FROM outbox_events")


def test_psycopg_sync_commit_and_rollback(dsn):
    committed, rolled_back = make_event(), make_event()
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            outbox.add(conn, committed)
        with pytest.raises(Rollback), conn.transaction():
            outbox.add(conn, rolled_back)
            raise Rollback
    assert count(dsn, committed.id) == 1 and count(dsn, rolled_back.id) == 0
    row = fetch_one(dsn, "SELECT context, event_type, event_version, payload, published_at FROM outbox_events "
                    "WHERE id = %s", (committed.id,))
    assert row == ("sea", "order_placed", 1, {"total": 42, "items": ["a", "b"]}, None)


async def test_psycopg_async(dsn):
    committed, rolled_back = make_event(), make_event()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            await outbox.add_many_async(conn, [committed, make_event()])
        with pytest.raises(Rollback):
            async with conn.transaction():
                await outbox.add_async(conn, rolled_back)
                raise Rollback
    assert count(dsn, committed.id) == 1 and count(dsn, rolled_back.id) == 0 and count(dsn) == 2


def _sqlalchemy_url(dsn: str, driver: str) -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://")


def test_sqlalchemy_session(dsn):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(_sqlalchemy_url(dsn, "psycopg"))
    committed, rolled_back = make_event(), make_event()
    with Session(engine) as session:
        with session.begin():
            outbox.add(session, committed)
        with pytest.raises(Rollback), session.begin():
            outbox.add(session, rolled_back)
            raise Rollback
    engine.dispose()
    assert count(dsn, committed.id) == 1 and count(dsn, rolled_back.id) == 0


async def test_sqlalchemy_async_session(dsn):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(_sqlalchemy_url(dsn, "psycopg"))
    committed, rolled_back = make_event(), make_event()
    async with AsyncSession(engine) as session:
        async with session.begin():
            await outbox.add_async(session, committed)
        with pytest.raises(Rollback):
            async with session.begin():
                await outbox.add_async(session, rolled_back)
                raise Rollback
    await engine.dispose()
    assert count(dsn, committed.id) == 1 and count(dsn, rolled_back.id) == 0


async def test_asyncpg(dsn):
    import asyncpg

    committed, rolled_back = make_event(correlation_id=uuid.uuid4()), make_event()
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await outbox.add_async(conn, committed)
        with pytest.raises(Rollback):
            async with conn.transaction():
                await outbox.add_async(conn, rolled_back)
                raise Rollback
    finally:
        await conn.close()
    assert count(dsn, committed.id) == 1 and count(dsn, rolled_back.id) == 0
    assert scalar(dsn, "SELECT correlation_id FROM outbox_events WHERE id = %s", (committed.id,)) == \
        committed.correlation_id


def test_invalid_events_fail_before_the_database(dsn):
    with psycopg.connect(dsn) as conn:
        for bad, code in [(make_event(event_type=""), ErrorCode.INVALID_OUTBOX),
                          (make_event(occurred_at=datetime.now(timezone.utc) + timedelta(hours=1)),
                           ErrorCode.FUTURE_EVENT),
                          (make_event(payload={"when": object()}), ErrorCode.INVALID_OUTBOX)]:
            with pytest.raises(SeamqError) as err:
                outbox.add_many(conn, [make_event(), bad])  # the good one is not written either
            assert err.value.code == code
        conn.commit()
    assert count(dsn) == 0


def test_database_check_is_the_last_line(dsn):
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, occurred_at) "
            "VALUES (gen_random_uuid(), 'sea', 'a', '1', 'e', '{}', now() + interval '1 hour')"
        )


def test_unsupported_connection():
    with pytest.raises(SeamqError) as err:
        outbox.add(object(), make_event())
    assert err.value.code == ErrorCode.UNSUPPORTED_CONNECTION


async def test_a_connection_outside_a_transaction_is_refused_and_writes_nothing(dsn):
    """An autocommit connection committed the event on its own, apart from the state change: the two
    were not atomic, and nothing said so."""
    import asyncpg
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.orm import Session

    def refused(call):
        with pytest.raises(SeamqError) as err:
            call()
        assert err.value.code == ErrorCode.NOT_IN_TRANSACTION and "one transaction" in err.value.message

    async def refused_async(coro):
        with pytest.raises(SeamqError) as err:
            await coro
        assert err.value.code == ErrorCode.NOT_IN_TRANSACTION

    with psycopg.connect(dsn, autocommit=True) as conn:
        refused(lambda: outbox.add(conn, make_event()))
        with conn.transaction():  # inside a transaction block it is fine
            outbox.add(conn, make_event())
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await refused_async(outbox.add_async(conn, make_event()))
    engine = create_engine(_sqlalchemy_url(dsn, "psycopg"), isolation_level="AUTOCOMMIT")
    with Session(engine) as session:
        refused(lambda: outbox.add(session, make_event()))
    with engine.connect() as connection:
        refused(lambda: outbox.add(connection, make_event()))
    engine.dispose()
    async_engine = create_async_engine(_sqlalchemy_url(dsn, "psycopg"), isolation_level="AUTOCOMMIT")
    async with async_engine.connect() as connection:
        await refused_async(outbox.add_async(connection, make_event()))
    await async_engine.dispose()
    conn = await asyncpg.connect(dsn)
    try:
        await refused_async(outbox.add_async(conn, make_event()))
    finally:
        await conn.close()
    assert count(dsn) == 1, "only the write inside a transaction"


async def test_async_connections_need_add_async_so_a_forgotten_await_cannot_lose_the_event(dsn):
    """`outbox.add(async_conn, e)` without await committed the state and lost the event, with only a
    RuntimeWarning. `add` now refuses async connections at once; `add_async` is a coroutine function,
    which type checkers flag when it is not awaited."""
    import inspect

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            with pytest.raises(SeamqError, match="add_async") as err:
                outbox.add(conn, make_event())
            assert err.value.code == ErrorCode.UNSUPPORTED_CONNECTION
    with psycopg.connect(dsn) as conn, conn.transaction():
        with pytest.raises(SeamqError, match="without await"):
            await outbox.add_async(conn, make_event())
    assert inspect.iscoroutinefunction(outbox.add_async) and inspect.iscoroutinefunction(outbox.add_many_async)
    assert count(dsn) == 0
