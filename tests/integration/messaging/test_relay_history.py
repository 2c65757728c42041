"""The relay on a backlog once the outbox has a history (issue 44).

A deployment keeps days of published rows, and its statistics are taken while nothing is pending,
which is the normal state. Then the broker is away for a few minutes and a backlog builds up. The
planner, told that no row is unpublished, once answered the claim's check for rows backing off by
walking every pending row once per candidate: a catch-up at 100 events/s instead of 15,000.

These tests count the rows each statement's plan reads, so they do not depend on the machine's
speed. The time a catch-up takes is measured by the bench (`bench/history.py`).
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from seamq.pg.outbox_repo import RELAY_LOCK_CLASS, relay_session
from seamq.pg.sql import query, to_positional

from helpers import read_stream, wait_for
from helpers.relay import check_exactly_once_in_order, events_for, relay_running, unpublished, write

HISTORY = 100_000  # published rows, analyzed with nothing pending
LIMIT, SCAN, BUCKETS = 500, 2000, 16  # the relay's claim: what PgOutbox.claim asks for with batch 500


def load_history(dsn: str, rows: int, backing_off: int = 40) -> None:
    """`rows` published rows, statistics taken with nothing pending, and autovacuum kept away so
    that nothing corrects them behind the test's back (a large table waits for 10% of changes).
    A few rows back off at the end, so the claim's check for them has something to find."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (leaf,) in conn.execute("SELECT relid::text FROM pg_partition_tree('outbox_events') WHERE isleaf").fetchall():
            conn.execute(f"ALTER TABLE {leaf} SET (autovacuum_enabled = false)")
        # UUIDv7 ids of the last hour, in today's partition, where the backlog goes too: the
        # worst case, a day's history in the heap and indexes the backlog is read from (just
        # after midnight, the hour is today's first minutes).
        conn.execute(
            "INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
            "                           published_at, publish_attempts, stream_seq, part) "
            "SELECT x.id, 'sea', 'order', 'h-' || (x.g %% 1000), 'order_placed', '{\"n\": 1}', "
            "       now() - interval '1 hour', 1, x.g, seamq_id_time(x.id) "
            "FROM (SELECT g, CAST(lpad(to_hex(CAST(extract(epoch FROM greatest(now() - interval '1 hour', "
            "                                       date_trunc('day', now(), 'UTC'))) * 1000 AS bigint)), "
            "                          12, '0') || '7' || substr(md5(g::text), 1, 3) || '8' || "
            "                     substr(md5(g::text), 4, 15) AS uuid) AS id "
            "      FROM generate_series(1, %s) g) x", (rows,))
        conn.execute("VACUUM ANALYZE outbox_events")
        assert conn.execute("SELECT sum(n_live_tup) > 0 FROM pg_stat_user_tables "
                            "WHERE relname LIKE 'outbox_events%%'").fetchone()[0]


def back_off(dsn: str, count: int) -> None:
    """The first `count` pending rows fail and wait a minute, as a row the broker refused does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE outbox_events SET next_attempt_at = now() + interval '1 minute', publish_attempts = 1 "
                     "WHERE id IN (SELECT id FROM outbox_events WHERE published_at IS NULL ORDER BY seq LIMIT %s)",
                     (count,))


def rows_read(plan: dict) -> int:
    """Rows every scan in an EXPLAIN ANALYZE plan read: those it returned and those its filter
    dropped, once per loop."""
    node_read = 0
    if "Scan" in plan["Node Type"] and plan["Node Type"] not in ("CTE Scan", "Subquery Scan", "Function Scan"):
        node_read = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get("Actual Loops", 1)
    return node_read + sum(rows_read(child) for child in plan.get("Plans", []))


def explain(conn: psycopg.Connection, statement: str) -> dict:
    return conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}").fetchone()[0][0]["Plan"]


def execute(name: str, **values) -> str:
    """The relay's prepared statement with its values, in the order PREPARE gave them."""
    _, names = to_positional(query(name))
    return f"EXECUTE seamq_{name}({', '.join(str(values[n]) for n in names)})"


async def claim_plans(dsn: str) -> tuple[dict, dict]:
    """One claim's two statements as the relay runs them: its session's settings, prepared,
    generic plans, in one transaction that is rolled back."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await relay_session(conn)
        plans = []
        async with conn.transaction(force_rollback=True):
            for statement in (execute("claim_buckets", scan=SCAN, lock_class=RELAY_LOCK_CLASS, buckets=BUCKETS),
                              execute("claim_rows", limit=LIMIT)):
                cur = await conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}")
                plans.append((await cur.fetchone())[0][0]["Plan"])
        return plans[0], plans[1]


async def test_a_claim_reads_what_it_claims_whatever_the_statistics(dsn):
    load_history(dsn, HISTORY)
    write(dsn, events_for(aggregates=200, per_aggregate=25), per_tx=5000)  # 5,000 pending
    back_off(dsn, 40)
    buckets, rows = await claim_plans(dsn)
    assert rows["Actual Rows"] == LIMIT
    # The claim reads the head of the pending index (its scan window, and past other relays'
    # buckets) and the rows backing off once. Before the fix: 5,000 rows per candidate, 2.5 million.
    assert rows_read(buckets) <= 2 * SCAN, json.dumps(buckets)[:4000]
    assert rows_read(rows) <= 10 * LIMIT, json.dumps(rows)[:4000]


@pytest.mark.parametrize("relay_settings", [True, False], ids=["relay-session", "plain-session"])
async def test_backlog_reads_what_is_unpublished_not_the_history(dsn, relay_settings):
    """`seamq backlog`, the console and the relay's gauge: what is pending and held, never the
    history, in the relay's session and in a plain one (the CLI's, the console's)."""
    load_history(dsn, HISTORY)
    write(dsn, events_for(aggregates=100, per_aggregate=10), per_tx=1000)
    with psycopg.connect(dsn) as conn:
        if relay_settings:
            conn.execute("SET enable_bitmapscan = off")
            conn.execute("SET enable_seqscan = off")
        plan = explain(conn, query("outbox_backlog"))
    assert rows_read(plan) <= 2 * 1000, json.dumps(plan)[:4000]


async def test_a_backlog_after_history_is_published_once_in_order(dsn, nats_server, nc, provisioned):
    load_history(dsn, HISTORY)
    events = events_for(aggregates=100, per_aggregate=30)
    write(dsn, events, per_tx=3000)
    async with relay_running(dsn, nats_server.url, provisioned, batch_size=500):
        await wait_for(lambda: unpublished(dsn) == 0, what="the backlog published", timeout=120)
        await asyncio.sleep(0.3)  # room for a wrongly published second copy to show up
    check_exactly_once_in_order(await read_stream(nc.jetstream(), "SEA_EVENTS"), events)
