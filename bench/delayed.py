"""Delayed delivery: how long after its deliver_at a delayed event reaches its handler.

Delayed events (deliver_at spread over a few seconds ahead) are written while
immediate events flow at 1,000/s, through one relay and one consumer process
with an in-process no-op handler. Lateness = inbox processed_at - deliver_at.
Beside it, from the same run: commit -> handled of the immediate events (the
path every event takes), and how late asyncio's own timers fire in this
process for the same deadlines (the floor for any timer).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import datetime, timedelta, timezone

import psycopg

from bench.common import Result, payload, relay_and_consumer, services, stop
from bench.e2e import offer, percentile
from seamq import outbox
from seamq.model import Event

HANDLED_WAIT = 300.0  # seconds the bench waits for the last events to be handled


async def timer_lateness(deadlines: list[float]) -> list[float]:
    async def one(at: float) -> float:
        await asyncio.sleep(max(0.0, at - time.time()))
        return time.time() - at

    return await asyncio.gather(*(one(at) for at in deadlines))


async def handled(dsn: str, expected: set[str], wait: float) -> dict[str, float]:
    """processed_at of each inbox row, once every expected message has one or `wait` has passed (a
    busy machine handles the last ones seconds after they are due)."""
    deadline = time.monotonic() + wait
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = dict(conn.execute("SELECT message_id::text, extract(epoch FROM processed_at)::float8 "
                                     "FROM inbox_messages WHERE processed_at IS NOT NULL").fetchall())
        if expected <= rows.keys() or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)


async def run(count: int, size: int) -> Result:
    quick = count < 10_000
    delayed_count, spread = (50, 2.0) if quick else (500, 8.0)
    result = Result("delayed")
    with services() as svc:
        dsn, relay, consumer = await relay_and_consumer(svc, "delayed")
        try:
            start = datetime.now(timezone.utc) + timedelta(seconds=1)
            due = {}
            with psycopg.connect(dsn) as conn, conn.transaction():
                for n in range(delayed_count):
                    event = Event(context="vibespro", aggregate_type="vibe", aggregate_id=f"d-{n}",
                                  event_type="vibe_created", payload=payload(size, n))
                    at = start + timedelta(seconds=spread * n / delayed_count)
                    outbox.add(conn, event, deliver_at=at)
                    due[str(event.id)] = at.timestamp()
            (commits, offered), floor = await asyncio.gather(
                offer(dsn, 1000, spread + 2, size), timer_lateness(list(due.values())))
            rows = await handled(dsn, {*due, *commits}, HANDLED_WAIT)
        finally:
            relay_rss, consumer_rss = stop(relay), stop(consumer)
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    for what, values in (
        ("delayed: processed_at - deliver_at", [rows[i] - at for i, at in due.items() if i in rows]),
        ("immediate, same run: processed_at - commit", [rows[i] - t for i, t in commits.items() if i in rows]),
        ("asyncio timer lateness, same deadlines (floor)", floor),
    ):
        if not values:  # none handled within HANDLED_WAIT: said in the note below, not a crash
            continue
        result.add(measure=what, count=len(values), p50_ms=ms(statistics.median(values)),
                   p99_ms=ms(percentile(values, 0.99)), max_ms=ms(max(values)), min_ms=ms(min(values)),
                   events_per_s=round(offered))
    result.notes.append(f"{len([i for i in due if i in rows])}/{len(due)} delayed events handled; "
                        f"peak RSS relay {relay_rss:.0f} MB, consumer {consumer_rss:.0f} MB")
    return result
