"""Enqueue a job inside the caller's own database transaction (the OJS transactional-enqueue
pattern, through seamq's outbox):

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders ...")
        job_id = seamq.jobs.enqueue(conn, "invoice.send", [order_id], queue="billing")

Rollback: no job. Commit: exactly one job, once the relay (`seamq relay`) has
published the row and the job server has taken it in (seamq.jobs.intake); the
job id is the dedup key end to end. The job is validated here, as the server
would, so a wrong one fails the caller's transaction instead of vanishing later.
Connections: as `outbox.add` (psycopg, SQLAlchemy; `enqueue_async` for their
async kinds and asyncpg), and refused outside a transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Iterable

from seamq import outbox
from seamq.jobs.model import OjsError, iso, new_record, utcnow, uuid7
from seamq.jobs.route import ROUTE
from seamq.model import ErrorCode, Event, SeamqError


def job_event(job_type: str, args: Iterable[Any] = (), *, queue: str | None = None, meta: dict | None = None,
              **options: Any) -> Event:
    """The outbox event that carries one job (its id: the job's). `options` are OJS's: priority,
    scheduled_at (a datetime or RFC 3339), expires_at, retry, unique, timeout_ms, tags, ..."""
    job_id = uuid7()
    options = {k: iso(v) if isinstance(v, datetime) else v for k, v in options.items() if v is not None}
    if queue is not None:
        options["queue"] = queue
    body: dict[str, Any] = {"id": job_id, "type": job_type, "args": list(args)}
    if options:
        body["options"] = options
    if meta is not None:
        body["meta"] = meta
    try:
        new_record(body, utcnow())  # the server's own validation, before anything is written
    except OjsError as exc:
        raise SeamqError(ErrorCode.INVALID_JOB, f"job {job_type!r} refused: {exc.message}") from None
    return Event(context=ROUTE.context, aggregate_type="job", aggregate_id=job_id, event_type="enqueue",
                 payload=body, id=uuid.UUID(job_id))


def enqueue(conn: Any, job_type: str, args: Iterable[Any] = (), **options: Any) -> str:
    """Write a job in the caller's transaction (a sync connection); returns its id."""
    event = job_event(job_type, args, **options)
    outbox.add(conn, event)
    return str(event.id)


async def enqueue_async(conn: Any, job_type: str, args: Iterable[Any] = (), **options: Any) -> str:
    """`enqueue` through an async connection (psycopg, SQLAlchemy async, asyncpg)."""
    event = job_event(job_type, args, **options)
    await outbox.add_async(conn, event)
    return str(event.id)
