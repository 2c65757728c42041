"""The write API: the outbox row lives and dies with the caller's transaction, whatever the driver."""

import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from seamq import outbox
from seamq.model import ErrorCode, Event, SeamqError

from helpers import scalar


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
    row = psycopg.connect(dsn).execute(
        "SELECT context, event_type, event_version, payload, published_at FROM outbox_events WHERE id = %s",
        (committed.id,),
    ).fetchone()
    assert row == ("sea", "order_placed", 1, {"total": 42, "items": ["a", "b"]}, None)


async def test_psycopg_async(dsn):
    committed, rolled_back = make_event(), make_event()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            await outbox.add_many(conn, [committed, make_event()])
        with pytest.raises(Rollback):
            async with conn.transaction():
                await outbox.add(conn, rolled_back)
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
            await outbox.add(session, committed)
        with pytest.raises(Rollback):
            async with session.begin():
                await outbox.add(session, rolled_back)
                raise Rollback
    await engine.dispose()
    assert count(dsn, committed.id) == 1 and count(dsn, rolled_back.id) == 0


async def test_asyncpg(dsn):
    import asyncpg

    committed, rolled_back = make_event(correlation_id=uuid.uuid4()), make_event()
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await outbox.add(conn, committed)
        with pytest.raises(Rollback):
            async with conn.transaction():
                await outbox.add(conn, rolled_back)
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
