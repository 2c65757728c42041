"""Scenario: one relay catching up on a backlog once the outbox has a history (issue 44).

A deployment keeps its published rows for days (5 million: a week at 9 events/s), its statistics
are taken while nothing is pending (the normal state), then a NATS outage of a few minutes leaves
a backlog. The same relay drains the same backlog on an empty outbox and on that one, in one run.
"""

from __future__ import annotations

import time

import psycopg

from bench.common import SEAMQ, CpuWindow, Result, cpu_per_row, fresh_database, provision, services, spawn, stop, write_outbox
from bench.relay import reset_stream

HISTORY = 5_000_000


def load_history(dsn: str, rows: int) -> float:
    """`rows` published rows, then VACUUM ANALYZE with nothing pending; seconds it took. Then a
    CHECKPOINT: a week's history is on disk, not a gigabyte of dirty pages that the checkpointer would
    still be writing while the relay is measured."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(0, rows, 1_000_000):  # a transaction per million: no one huge commit
            conn.execute(
                "INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
                "                           published_at, publish_attempts, stream_seq) "
                "SELECT gen_random_uuid(), 'sea', 'order', 'h-' || (g %% 10000), 'order_placed', "
                "       '{\"n\": 1, \"kind\": \"history\"}', now() - interval '1 day', 1, g "
                "FROM generate_series(%s, %s) g", (first + 1, min(rows, first + 1_000_000)))
        conn.execute("VACUUM ANALYZE outbox_events")
    return time.monotonic() - started


def checkpoint(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


async def drained(svc, relay, count: int, timeout: float) -> tuple[int, dict]:
    """A relay's rate over a backlog of `count` rows of kind 'bench' (rows / first to last
    published_at), with the CPU per row of the relay and of PostgreSQL; the relay is stopped."""
    cpu = CpuWindow(relay=(relay.pid,), pg=(svc.pg.proc.pid,))
    try:
        with psycopg.connect(svc.dsn, autocommit=True) as conn:
            pending = lambda: conn.execute(  # noqa: E731  (the pending index, as `seamq backlog` reads it)
                "SELECT count(*) FROM outbox_events WHERE published_at IS NULL AND NOT held").fetchone()[0]
            used = await cpu_per_row(cpu, lambda: count - pending(), count, timeout=timeout)
            n, seconds = conn.execute(
                "SELECT count(*), extract(epoch FROM max(published_at) - min(published_at)) FROM outbox_events "
                "WHERE published_at IS NOT NULL AND payload->>'kind' = 'bench'").fetchone()
    finally:
        stop(relay)
    return round(n / float(seconds)), used


async def catch_up(svc, count: int, size: int, history: int) -> dict:
    await reset_stream(svc.nats.url)
    dsn = await fresh_database(svc, f"history{history}")
    loaded = load_history(dsn, history) if history else 0.0
    write_outbox(dsn, count, size)
    checkpoint(dsn)  # both cases start from what is on disk
    rate, used = await drained(svc, spawn([*SEAMQ, "relay"], svc.env(SEAMQ_RELAY__BATCH_SIZE=500)), count, 900)
    return dict(history_rows=history, load_and_analyze_s=round(loaded), backlog=count, events_per_s=rate, **used)


async def run(count: int, size: int) -> Result:
    result = Result("relay_history")
    history = HISTORY if count >= 10_000 else 20 * count
    with services() as svc:
        await provision(svc.nats.url)
        empty = await catch_up(svc, count, size, 0)
        result.add(case="relay x1, empty outbox", ratio=1.0, **empty)
        full = await catch_up(svc, count, size, history)
        result.add(case="relay x1, history analyzed with nothing pending",
                   ratio=round(full["events_per_s"] / empty["events_per_s"], 2), **full)
    result.notes.append("the history: published rows over 10,000 aggregates, then VACUUM ANALYZE while nothing is "
                        "pending; then the backlog (the same rows as the empty case) and one relay, batch 500; "
                        "rate = backlog rows / (last published_at - first); cpu_us_* per backlog row")
    return result
