"""Scenario: retention of a day of outbox rows (issue 45): the day's partition dropped, against the
same rows deleted in batches as before partitioning, each while a producer writes.

The producer adds one event per transaction (as a service does), on one connection, and times
each commit; what it sees while the retention runs is what the relay and the consumer see, since
they take the same table's locks.
"""

from __future__ import annotations

import asyncio
import statistics
from contextlib import asynccontextmanager
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg

from bench.common import Result, fresh_database, payload, relay_and_consumer, services, stop, uuid7_at
from bench.consumer import CONSUMER
from bench.e2e import offer
from seamq import outbox
from seamq.model import Event
from seamq.ids import uuid7
from seamq.pg import partitions
from seamq.pg.sql import query

IN_THE_DAY = "%(ms)s + g * 86400000::bigint / %(rows)s"  # the day's rows spread over its milliseconds

DAY_ROWS = 10_000_000
DAY = timedelta(days=1)
ROUNDS, ROUND_PAUSE = 10, 0.5  # drops tried while the writers hold the tables past the lock timeout


def load_day(dsn: str, rows: int, day: datetime | None) -> float:
    """`rows` published rows published 8 days ago: ids dated across `day` (its partition), or, with
    no day, UUIDv4 ids (the legacy partition, as every row was before 0013). Seconds it took."""
    started = time.monotonic()
    first_ms = int(day.timestamp() * 1000) if day else 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(0, rows, 1_000_000):  # a transaction per million
            ident = "gen_random_uuid()" if day is None else uuid7_at(IN_THE_DAY)
            conn.execute(
                "INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
                "                           published_at, publish_attempts, stream_seq, part) "
                "SELECT x.id, 'sea', 'order', 'h-' || (x.g %% 10000), 'order_placed', "
                "       '{\"n\": 1, \"kind\": \"history\"}', now() - interval '8 days', 1, x.g, seamq_id_time(x.id) "
                f"FROM (SELECT g, {ident} AS id FROM generate_series(%(lo)s, %(hi)s) g) x",
                dict(ms=first_ms, rows=rows, lo=first + 1, hi=min(rows, first + 1_000_000)))
        conn.execute("CHECKPOINT")
    return time.monotonic() - started


class Producer:
    """One event per transaction; each commit's time, with when it began."""

    def __init__(self, dsn: str, ids_at: datetime) -> None:
        self.dsn, self.ids_at, self.stop = dsn, ids_at, threading.Event()
        self.commits: list[tuple[float, float]] = []
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        ms = int(self.ids_at.timestamp() * 1000) if self.ids_at else 0
        with psycopg.connect(self.dsn) as conn:
            while not self.stop.is_set():
                began = time.monotonic()
                with conn.transaction():
                    conn.execute(query("insert_outbox"), dict(
                        id=uuid7(ms) if self.ids_at else uuid.uuid4(), context="sea", aggregate_type="order",
                        aggregate_id="p-1", event_type="order_placed", event_version=1, payload="{}",
                        occurred_at=datetime.now(timezone.utc), correlation_id=None, causation_id=None,
                        traceparent=None, deliver_at=None))
                self.commits.append((began, time.monotonic() - began))

    def during(self, start: float, end: float) -> dict:
        times = sorted(t for began, t in self.commits if start <= began <= end)
        if not times:
            return dict(commits=0)
        return dict(commits=len(times), commit_p50_ms=round(statistics.median(times) * 1000, 2),
                    commit_p99_ms=round(times[int(len(times) * 0.99)] * 1000, 2),
                    commit_max_ms=round(times[-1] * 1000, 1))


async def retain(svc, rows: int, by_drop: bool) -> dict:
    dsn = await fresh_database(svc, f"retention_{'drop' if by_drop else 'delete'}")
    now = datetime.now(timezone.utc)
    day = (now + 5 * DAY).replace(hour=0, minute=0, second=0, microsecond=0)
    later = day + 20 * DAY  # the producer writes into a day of its own, made ahead
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await partitions.make_ahead(conn, later)
    loaded = load_day(dsn, rows, day if by_drop else None)
    producer = Producer(dsn, later if by_drop else None)
    producer.thread.start()
    pause = 10 if rows >= 1_000_000 else 1  # a quick run checks that it works
    try:
        await asyncio.sleep(pause)  # the producer's own pace first
        started = time.monotonic()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            if by_drop:  # the day, 8 days after it: its retention of 7 days has passed
                done = await partitions.drop_expired(conn, "outbox_events", 7 * DAY, day + 8 * DAY)
                outcome = f"{len(done)} partitions dropped, the table held {sum(d.held for d in done) * 1000:.0f} ms"
            else:
                purged = await partitions.purge(conn, "outbox_events", 7 * DAY)
                outcome = f"{purged.deleted} rows deleted"
        ended = time.monotonic()
        await asyncio.sleep(pause / 2)
    finally:
        producer.stop.set()
        producer.thread.join()
    before = producer.during(started - pause, started)
    return dict(rows=rows, load_s=round(loaded), retention_s=round(ended - started, 3),
                rows_per_s=round(rows / (ended - started)), outcome=outcome,
                **{f"before_{k}": v for k, v in before.items()}, **producer.during(started, ended))


def load_inbox_day(dsn: str, rows: int, day: datetime) -> None:
    """`rows` messages the bench consumer handled, with ids dated across `day` (its partition)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(0, rows, 1_000_000):
            conn.execute(
                "INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, received_at, "
                "                            attempts, status, processed_at, part) "
                "SELECT %(consumer)s, x.id, 'vibespro.event.vibe_created.v1', 'vibe_created', 1, "
                "       now() - interval '8 days', 1, 'processed', now() - interval '8 days', seamq_id_time(x.id) "
                f"FROM (SELECT {uuid7_at(IN_THE_DAY)} AS id FROM generate_series(%(lo)s, %(hi)s) g) x",
                dict(consumer=CONSUMER, ms=int(day.timestamp() * 1000), rows=rows, lo=first + 1,
                     hi=min(rows, first + 1_000_000)))
        conn.execute("CHECKPOINT")


def dated_writer(dsn: str, size: int, at: datetime):
    """bench.e2e's writer (outbox.add_many_async in the writer's transaction) with ids dated `at`:
    the live events go to a day of their own, which the drop leaves alone."""
    ms = int(at.timestamp() * 1000)

    @asynccontextmanager
    async def connect():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async def write(count: int, first: int) -> list[str]:
                events = [Event(context="vibespro", aggregate_type="vibe", aggregate_id=f"v-{(first + i) % 500}",
                                event_type="vibe_created", payload=payload(size, i), id=uuid7(ms + first + i))
                          for i in range(count)]
                async with conn.transaction():
                    await outbox.add_many_async(conn, events)
                return [str(e.id) for e in events]

            yield write

    return connect


async def under_load(svc, rows: int, size: int) -> dict:
    """A day of the outbox and of the inbox dropped while a relay and a consumer carry 1,000 events/s
    (bench.e2e's open-loop writer): the commit -> handler latency of the events committed in the
    seconds before the drop, against those committed while it ran."""
    dsn, relay, consumer = await relay_and_consumer(svc, "retention_live", SEAMQ_CONSUMER__BATCH_SIZE=500)
    now = datetime.now(timezone.utc)
    day = (now + 5 * DAY).replace(hour=0, minute=0, second=0, microsecond=0)
    later = day + 20 * DAY
    pause = 10 if rows >= 1_000_000 else 2
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await partitions.make_ahead(conn, later)
        loaders = [threading.Thread(target=load_day, args=(dsn, rows, day)),
                   threading.Thread(target=load_inbox_day, args=(dsn, rows, day))]
        for t in loaders:
            t.start()
        for t in loaders:
            t.join()
        writing = asyncio.create_task(offer(dsn, 1000, 3 * pause, size, writer=dated_writer(dsn, size, later)))
        await asyncio.sleep(pause)
        started = time.time()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            done, rounds = [], 0
            for table in ("outbox_events", "inbox_messages"):
                rounds += await in_rounds(done, lambda table=table: partitions.drop_expired(conn, table, 7 * DAY, day + 8 * DAY))
        ended = time.time()
        commits, _ = await writing
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while True:
                handled = dict(conn.execute(
                    "SELECT message_id::text, extract(epoch FROM processed_at) FROM inbox_messages "
                    "WHERE message_id = ANY(%s::uuid[]) AND processed_at IS NOT NULL", (list(commits),)).fetchall())
                if len(handled) == len(commits) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
    finally:
        stop(relay), stop(consumer)
    assert len(handled) == len(commits), f"{len(handled)} of {len(commits)} live events handled"
    row = dict(rows=rows, outcome=f"{len(done)} partitions dropped (two of {rows:,} rows), the tables held "
               f"{sum(d.held for d in done) * 1000:.0f} ms in all, in {rounds} round(s)", retention_s=round(ended - started, 3),
               rows_per_s=round(2 * rows / (ended - started)))
    for name, lo, hi in (("before", started - pause, started), ("during", started, ended + 0.5)):
        latencies = sorted(float(handled[i]) - at for i, at in commits.items() if lo <= at < hi)
        row.update({f"{name}_events": len(latencies),
                    f"{name}_p50_ms": round(statistics.median(latencies) * 1000, 1),
                    f"{name}_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
                    f"{name}_max_ms": round(latencies[-1] * 1000, 1)})
    return row


async def in_rounds(done: list, dropping, rounds: int = ROUNDS) -> int:
    """As seamq.pg.partitions.maintain does: a lock not had within its timeout (the writers hold the
    table) ends the round, and the next tries again (what it dropped before stays dropped, uncounted
    here). The rounds used."""
    for n in range(1, rounds + 1):
        try:
            done += await dropping()
            return n
        except psycopg.errors.LockNotAvailable:
            if n == rounds:
                raise
            await asyncio.sleep(ROUND_PAUSE)
    raise AssertionError("unreachable")


async def run(count: int, size: int) -> Result:
    result = Result("retention")
    rows = DAY_ROWS if count >= 10_000 else 100 * count
    with services() as svc:
        result.add(case="a day dropped (partition)", **await retain(svc, rows, True))
        result.add(case="a day deleted in batches of 5,000 (legacy)", **await retain(svc, rows, False))
        result.add(case="a day of the outbox and of the inbox dropped under a relay and a consumer at 1,000/s",
                   **await under_load(svc, rows, size))
    result.notes.append("published rows of one day, 8 days old, retention 7 days; a producer commits one event per "
                        "transaction throughout; commit_* while the retention ran, before_* in the 10 s before")
    result.notes.append("under a relay and a consumer: latency from the writer's commit to the handler's, of the "
                        "events committed in the 10 s before the drops (before_*) and while they ran (during_*, "
                        "to 0.5 s after)")
    return result
