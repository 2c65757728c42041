"""Scenario 3: latency from outbox commit to handler, under open-loop offered load.

A writer commits outbox transactions on a fixed schedule (every 5 ms, however
the system keeps up: open loop), one relay and one consumer process run with
an in-process no-op handler. A short warm-up at 500/s is not measured. Latency = inbox processed_at (stamped in the
handler's transaction) - the writer's clock right after its commit returned.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from contextlib import asynccontextmanager

import psycopg

from bench.common import Result, payload, relay_and_consumer, services, stop
from seamq import outbox
from seamq.model import Event

TICK = 0.005


def seamq_writer(dsn: str, size: int, context: str = "vibespro"):
    """seamq's producer path: `outbox.add_many_async` in the writer's own transaction."""

    @asynccontextmanager
    async def connect():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async def write(count: int, first: int) -> list[str]:
                events = [Event(context=context, aggregate_type="vibe", aggregate_id=f"v-{(first + i) % 500}",
                                event_type="vibe_created", payload=payload(size, i)) for i in range(count)]
                async with conn.transaction():
                    await outbox.add_many_async(conn, events)
                return [str(e.id) for e in events]

            yield write

    return connect


async def offer(dsn: str, rate: int, seconds: float, size: int, writers: int = 4, writer=None) -> tuple[dict, float]:
    """Commit rate*TICK events every TICK seconds, spread over `writers` connections so a
    slow commit delays nothing else (open loop); returns commit times by event id (str) and the
    rate achieved. `writer` (default seamq's outbox) opens a connection and gives its write."""
    writer = writer or seamq_writer(dsn, size)
    commits: dict[str, float] = {}
    per_tick = max(1, round(rate * TICK))
    ticks = int(seconds / TICK)
    started = time.monotonic()

    async def lane(number: int) -> None:
        async with writer() as write:
            for tick in range(number, ticks, writers):
                delay = started + tick * TICK - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                ids = await write(per_tick, tick * per_tick)
                now = time.time()
                for event_id in ids:
                    commits[event_id] = now

    await asyncio.gather(*(lane(number) for number in range(writers)))
    return commits, len(commits) / (time.monotonic() - started)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(count: int, size: int) -> Result:
    quick = count < 10_000
    seconds = 2.0 if quick else 8.0
    rates = [1000, 2000] if quick else [1000, 2000, 5000, 10000]
    result = Result("e2e")
    with services() as svc:
        dsn, relay, consumer = await relay_and_consumer(svc, "e2e", SEAMQ_CONSUMER__BATCH_SIZE=500)
        # Warm-up, not measured: first statements, caches and the young tables'
        # first autovacuum are start-up effects, not steady-state latency.
        await offer(dsn, 500, 1.0 if quick else 3.0, size)
        sustained = 0
        try:
            for rate in rates:
                commits, offered = await offer(dsn, rate, seconds, size)
                drained_by = time.monotonic() + 30
                with psycopg.connect(dsn, autocommit=True) as conn:
                    while True:
                        rows = conn.execute(
                            "SELECT message_id, extract(epoch FROM processed_at) FROM inbox_messages "
                            "WHERE message_id = ANY(%s::uuid[]) AND processed_at IS NOT NULL", (list(commits),)).fetchall()
                        if len(rows) == len(commits) or time.monotonic() > drained_by:
                            break
                        await asyncio.sleep(0.2)
                latencies = [float(t) - commits[str(m)] for m, t in rows]
                kept_up = len(rows) == len(commits) and percentile(latencies, 0.99) < 1.0
                sustained = max(sustained, round(offered)) if kept_up else sustained
                ms = lambda v: round(v * 1000, 1)  # noqa: E731
                result.add(offered_per_s=rate, achieved_per_s=round(offered), handled=len(rows),
                           p50_ms=ms(statistics.median(latencies)), p95_ms=ms(percentile(latencies, 0.95)),
                           p99_ms=ms(percentile(latencies, 0.99)), max_ms=ms(max(latencies)), kept_up=kept_up)
        finally:
            relay_rss, consumer_rss = stop(relay), stop(consumer)
        result.notes.append(f"highest sustained rate tested: {sustained}/s (all handled, p99 < 1 s); "
                            f"peak RSS relay {relay_rss:.0f} MB, consumer {consumer_rss:.0f} MB")
    return result
