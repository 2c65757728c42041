"""The transactional outbox write API (REQ-050, INV-022).

`add(conn, event)` inserts an outbox row through the caller's own connection
and never commits: the row lives or dies with the caller's transaction. It
accepts what people already use: psycopg 3 (sync or async), a SQLAlchemy 2
Session/AsyncSession/Connection, or an asyncpg connection. With an async
connection it returns an awaitable.

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("UPDATE accounts ...")
        add(conn, Event(context="sea", aggregate_type="account", ...))
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any, Awaitable, Iterable

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


def _row(event: Event | EventModel) -> dict[str, Any]:
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


def _kind(conn: Any) -> str:
    module = type(conn).__module__
    name = type(conn).__name__
    if module.startswith("psycopg"):
        return "psycopg_async" if name.startswith("Async") else "psycopg"
    if module.startswith("asyncpg"):
        return "asyncpg"
    if module.startswith("sqlalchemy"):
        return "sqlalchemy_async" if name.startswith("Async") else "sqlalchemy"
    raise SeamqError(
        ErrorCode.UNSUPPORTED_CONNECTION,
        f"cannot write the outbox through a {module}.{name}: pass a psycopg 3 connection, "
        "a SQLAlchemy 2 Session/AsyncSession/Connection, or an asyncpg connection",
    )


def add(conn: Any, event: Event | EventModel, *, deliver_at: datetime | None = None) -> Awaitable[None] | None:
    """Insert one event in the caller's transaction. Await the result for async connections.

    `event` is an Event (its payload a dict or a typed EventModel) or an EventModel whose class
    declares its aggregate (seamq.typed). `deliver_at`: handlers see it no earlier (and, with a
    relay running, within about 100 ms after); it does not hold back its aggregate's other events
    (docs/operations.md, "Delayed delivery")."""
    if deliver_at is not None:
        event = dataclasses.replace(event.event() if isinstance(event, EventModel) else event, deliver_at=deliver_at)
    return add_many(conn, [event])


def add_many(conn: Any, events: Iterable[Event | EventModel]) -> Awaitable[None] | None:
    """Insert several events in the caller's transaction, validated before any is written."""
    rows = [_row(e) for e in events]
    sql = query("insert_outbox")
    kind = _kind(conn)
    if kind == "psycopg":
        if rows:
            with conn.cursor() as cur:
                cur.executemany(sql, rows)
        return None
    if kind == "sqlalchemy":
        if rows:
            conn.execute(_text(sql), rows)
        return None
    return _add_async(kind, conn, sql, rows)


async def _add_async(kind: str, conn: Any, sql: str, rows: list[dict]) -> None:
    if not rows:
        return
    if kind == "psycopg_async":
        async with conn.cursor() as cur:
            await cur.executemany(sql, rows)
    elif kind == "sqlalchemy_async":
        await conn.execute(_text(sql), rows)
    else:  # asyncpg: positional parameters, and it wants str for jsonb text input
        positional, names = to_positional(sql)
        await conn.executemany(positional, [[row[n] for n in names] for row in rows])


def _text(sql: str):
    from sqlalchemy import text

    return text(to_sqlalchemy(sql))
