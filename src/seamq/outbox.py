"""The transactional outbox write API (REQ-050, INV-022).

`add(conn, event)` inserts an outbox row through the caller's own connection
and never commits: the row lives or dies with the caller's transaction. It
accepts what people already use: psycopg 3, a SQLAlchemy 2 Session or
Connection; `await add_async(conn, event)` takes their async kinds and
asyncpg. Each refuses a connection outside a transaction (autocommit), where
the event would commit apart from the caller's state change.

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("UPDATE accounts ...")
        add(conn, Event(context="sea", aggregate_type="account", ...))
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any, Iterable

from opentelemetry import trace

from seamq.model import ErrorCode, Event, SeamqError, check_outbox_policies, traceparent_for
from seamq.pg.sql import query, to_positional, to_sqlalchemy
from seamq.typed import EventModel, payload_json


def _traceparent(event: Event) -> str:
    """The caller's span when it has one, so the relay and the handler continue the producer's trace;
    else a trace of the event's own (model.traceparent_for). Only the W3C traceparent is kept."""
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return traceparent_for(event.id)
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"


def row_values(event: Event | EventModel) -> dict[str, Any]:
    """An event as the values of its outbox row, checked (the outbox's policies, a JSON payload): what
    every writer inserts, the in-memory outbox (seamq.memory_outbox) too."""
    if isinstance(event, EventModel):
        event = event.event()
    if isinstance(event.payload, EventModel):
        event = dataclasses.replace(event, payload=payload_json(event))
    check_outbox_policies(event)
    try:
        payload = json.dumps(event.payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SeamqError(ErrorCode.INVALID_OUTBOX, f"payload is not JSON-serialisable: {exc}") from None
    return dict(
        id=event.id, context=event.context, aggregate_type=event.aggregate_type,
        aggregate_id=event.aggregate_id, event_type=event.event_type, event_version=event.event_version,
        payload=payload, occurred_at=event.occurred_at, correlation_id=event.correlation_id,
        causation_id=event.causation_id, traceparent=_traceparent(event), deliver_at=event.deliver_at,
    )


# One small writer per driver. Each refuses a connection outside a transaction: there the outbox
# row would commit on its own, and the state change and the event would not be atomic (INV-022).

def _psycopg(conn: Any, sql: str, rows: list[dict]) -> None:
    _psycopg_in_transaction(conn)
    with conn.cursor() as cur:
        cur.executemany(sql, rows)


async def _psycopg_async(conn: Any, sql: str, rows: list[dict]) -> None:
    _psycopg_in_transaction(conn)
    async with conn.cursor() as cur:
        await cur.executemany(sql, rows)


def _psycopg_in_transaction(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise _not_in_transaction("an autocommit psycopg connection outside `conn.transaction()`")


def _sqlalchemy(conn: Any, sql: str, rows: list[dict]) -> None:
    connection = conn.connection() if hasattr(conn, "get_bind") else conn  # a Session: its connection
    _sqlalchemy_in_transaction(connection)
    connection.execute(_text(sql), rows)


async def _sqlalchemy_async(conn: Any, sql: str, rows: list[dict]) -> None:
    connection = await conn.connection() if hasattr(conn, "get_bind") else conn  # an AsyncSession
    _sqlalchemy_in_transaction(connection.sync_connection)
    await connection.execute(_text(sql), rows)


def _sqlalchemy_in_transaction(connection: Any) -> None:
    # SQLAlchemy begins a transaction by itself, unless the driver commits every statement.
    if getattr(connection.connection.dbapi_connection, "autocommit", False):
        raise _not_in_transaction("a SQLAlchemy connection with isolation_level AUTOCOMMIT")


async def _asyncpg(conn: Any, sql: str, rows: list[dict]) -> None:
    if not conn.is_in_transaction():  # asyncpg commits each statement outside `conn.transaction()`
        raise _not_in_transaction("an asyncpg connection outside `conn.transaction()`")
    positional, names = to_positional(sql)  # and it wants str for jsonb text input
    await conn.executemany(positional, [[row[n] for n in names] for row in rows])


def _not_in_transaction(what: str) -> SeamqError:
    return SeamqError(ErrorCode.NOT_IN_TRANSACTION, f"outbox.add got {what}: the event would commit on its own, "
                      "apart from your state change. Write both in one transaction")


_SYNC = {"psycopg": _psycopg, "sqlalchemy": _sqlalchemy}
_ASYNC = {"psycopg": _psycopg_async, "sqlalchemy": _sqlalchemy_async, "asyncpg": _asyncpg}


def _writer(conn: Any, *, asynchronous: bool):
    module, name = type(conn).__module__, type(conn).__name__
    driver = next((d for d in ("psycopg", "sqlalchemy", "asyncpg") if module.startswith(d)), None)
    if driver is None:
        raise SeamqError(
            ErrorCode.UNSUPPORTED_CONNECTION,
            f"cannot write the outbox through a {module}.{name}: pass a psycopg 3 connection, "
            "a SQLAlchemy 2 Session/AsyncSession/Connection, or an asyncpg connection",
        )
    is_async = driver == "asyncpg" or name.startswith("Async")
    if is_async != asynchronous:
        fix = "`await outbox.add_async(conn, event)`" if is_async else "`outbox.add(conn, event)`, without await"
        raise SeamqError(ErrorCode.UNSUPPORTED_CONNECTION, f"{module}.{name} is {'' if is_async else 'not '}an "
                         f"async connection: use {fix}")
    return (_ASYNC if asynchronous else _SYNC)[driver]


def add(conn: Any, event: Event | EventModel, *, deliver_at: datetime | None = None) -> None:
    """Insert one event in the caller's transaction, through a sync connection (psycopg, SQLAlchemy
    Session or Connection); `add_async` takes async ones.

    `event` is an Event (its payload a dict or a typed EventModel) or an EventModel whose class
    declares its aggregate (seamq.typed). `deliver_at`: handlers see it no earlier (and, with a
    relay running, within about 100 ms after); it does not hold back its aggregate's other events
    (docs/operations.md, "Delayed delivery")."""
    add_many(conn, [_delayed(event, deliver_at)])


def add_many(conn: Any, events: Iterable[Event | EventModel]) -> None:
    """Insert several events in the caller's transaction, validated before any is written."""
    write = _writer(conn, asynchronous=False)
    rows = [row_values(e) for e in events]
    if rows:
        write(conn, query("insert_outbox"), rows)


async def add_async(conn: Any, event: Event | EventModel, *, deliver_at: datetime | None = None) -> None:
    """`add` through an async connection (psycopg AsyncConnection, SQLAlchemy AsyncSession or
    AsyncConnection, asyncpg). A coroutine function, so that a forgotten `await`, which would commit
    the state change without its event, is flagged by type checkers (mypy and pyright do by
    default) and by Python at run time; `add` refuses async connections outright."""
    await add_many_async(conn, [_delayed(event, deliver_at)])


async def add_many_async(conn: Any, events: Iterable[Event | EventModel]) -> None:
    """`add_many` through an async connection."""
    write = _writer(conn, asynchronous=True)
    rows = [row_values(e) for e in events]
    if rows:
        await write(conn, query("insert_outbox"), rows)


def _delayed(event: Event | EventModel, deliver_at: datetime | None) -> Event | EventModel:
    if deliver_at is None:
        return event
    return dataclasses.replace(event.event() if isinstance(event, EventModel) else event, deliver_at=deliver_at)


def _text(sql: str):
    from sqlalchemy import text

    return text(to_sqlalchemy(sql))
