"""The outbox, inbox and attempts tables partitioned by the time their ids tell (migration 0013,
seamq.pg.partitions): where rows land, what a dropped day keeps, and that a copy of a message
finds its row whatever day it arrives on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from datetime import datetime, timedelta, timezone

import psycopg

from helpers import SEAMQ
from helpers import scalar
from seamq.ids import uuid7
from seamq.pg import partitions
from seamq.pg.sql import query

DAY = timedelta(days=1)


def dated_id(at: datetime) -> uuid.UUID:
    return uuid7(int(at.timestamp() * 1000))


def add_event(conn, event_id: uuid.UUID, deliver_at: datetime | None = None) -> None:
    conn.execute(query("insert_outbox"), dict(
        id=event_id, context="sea", aggregate_type="order", aggregate_id="o-1", event_type="order_placed",
        event_version=1, payload="{}", occurred_at=datetime.now(timezone.utc), correlation_id=None,
        causation_id=None, traceparent=None, deliver_at=deliver_at))


def receive(conn, *ids: uuid.UUID) -> list[str]:
    """The consumer's first write of a batch: the ids that were new (the others are copies)."""
    items = json.dumps([[str(i), "sea.events.order_placed.v1", "order_placed", 1, None, None] for i in ids])
    return [r[0] for r in conn.execute(query("inbox_insert"), dict(consumer="billing", items=items)).fetchall()]


def where(conn, table: str, key: str, value: uuid.UUID) -> str:
    return conn.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {key} = %s", (value,)).fetchone()[0]


async def made(dsn: str, now: datetime) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await partitions.make_ahead(conn, now)


async def made_and_dropped(dsn: str, now: datetime, days: int) -> None:
    """As maintenance rounds do: a lock not had within lock_timeout (a busy machine) is tried again."""
    async def again(change, *args) -> None:
        while True:
            try:
                return await change(*args)
            except psycopg.errors.LockNotAvailable:
                await asyncio.sleep(0.05)

    for day in range(days):
        await again(made, dsn, now + day * DAY)
    for table in ("outbox_events", "inbox_messages"):
        await again(drop, dsn, table, DAY, now + days * DAY)


async def drop(dsn: str, table: str, older_than: timedelta, now: datetime) -> list[partitions.Dropped]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await partitions.drop_expired(conn, table, older_than, now)


async def test_every_key_has_a_partition_and_a_new_range_takes_its_rows_from_the_default_one(dsn):
    now = datetime.now(timezone.utc)
    today, foreign, far = dated_id(now), uuid.uuid4(), dated_id(now + 40 * DAY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for event_id in (today, foreign, far):
            add_event(conn, event_id)
        assert sorted(receive(conn, today, foreign, far)) == sorted(map(str, (today, foreign, far)))
        assert where(conn, "outbox_events", "id", today) == f"outbox_events_p{now:%Y%m%d}_0000"
        assert where(conn, "outbox_events", "id", foreign) == "outbox_events_legacy"  # no time in a UUIDv4
        assert where(conn, "outbox_events", "id", far) == "outbox_events_default"  # beyond the days made
    await made(dsn, now + 40 * DAY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        far_day = f"p{now + 40 * DAY:%Y%m%d}_0000"
        assert where(conn, "outbox_events", "id", far) == f"outbox_events_{far_day}"
        assert where(conn, "inbox_messages", "message_id", far) == f"inbox_messages_{far_day}"
        assert receive(conn, today, foreign, far) == [], "every copy finds its row"
        # The key is as unique as the id: no writer can file a row under another time.
        try:
            conn.execute("UPDATE outbox_events SET part = part + interval '1 day' WHERE id = %s", (today,))
            raise AssertionError("a row was filed under a time its id does not tell")
        except psycopg.errors.CheckViolation:
            pass


async def test_making_and_dropping_days_never_holds_a_lock_while_its_event_loop_is_blocked(dsn):
    """Workers make and drop days in their own event loop, which a handler or a test may block
    with a query of its own. Were a day's change a transaction of several round trips, that query
    could wait for the change's lock while the change waited for the loop: each waiting on the
    other, for good (as a test once did, its loop blocked polling the inbox just after midnight).
    Each change is one round trip, so the blocking query waits milliseconds."""
    now = datetime.now(timezone.utc)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("outbox_events", "inbox_messages", "inbox_attempts"):
            for name, *_ in conn.execute(query("partitions_dated"), dict(table=table)).fetchall():
                conn.execute(f"DROP TABLE {name}")
        conn.execute("SET statement_timeout = '60s'")
        maintainer = asyncio.create_task(made_and_dropped(dsn, now, 40))  # 120 days to make, 114 to drop
        writes = 0
        while not maintainer.done():
            await asyncio.sleep(0)  # the maintainer's turn, then the loop is this test's again
            with conn.transaction():  # blocks the loop as long as the parent is locked
                add_event(conn, dated_id(now))
                receive(conn, dated_id(now))
            writes += 1
        await maintainer
        for table in ("outbox_events", "inbox_messages", "inbox_attempts"):  # 3 ahead, at most 2 before
            assert len(conn.execute(query("partitions_dated"), dict(table=table)).fetchall()) <= 5, table
        assert scalar(dsn, "SELECT count(*) FROM outbox_events") == writes, "every unpublished row kept"
    assert writes > 1


async def test_a_copy_arriving_after_its_day_rolled_over_is_not_handled_twice(dsn):
    """The boundary forced: a message dated in the last millisecond of a day, its copy arriving
    once the next day's partition is the current one (and after the consumer's own time moved on)."""
    midnight = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) + DAY
    last, first = dated_id(midnight - timedelta(milliseconds=1)), dated_id(midnight)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert receive(conn, last) == [str(last)]
    await made(dsn, midnight + 3 * DAY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert receive(conn, last, first) == [str(first)], "the copy is found in its own day; the new one is new"
        assert where(conn, "inbox_messages", "message_id", last) != where(conn, "inbox_messages", "message_id", first)
        assert scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE message_id = %s", (last,)) == 1


async def test_a_dropped_day_keeps_its_unfinished_rows_in_the_default_partition_and_they_still_deduplicate(dsn):
    now = datetime.now(timezone.utc)
    handled, dead, held, published = (dated_id(now) for _ in range(4))
    with psycopg.connect(dsn, autocommit=True) as conn:
        receive(conn, handled, dead)
        conn.execute("UPDATE inbox_messages SET status = 'dead_lettered', processed_at = NULL WHERE message_id = %s",
                     (dead,))
        conn.execute(query("inbox_failed_alone"), dict(
            consumer="billing", id=dead, subject="s", event_type="order_placed", event_version=1, occurred_at=None,
            deliver_at=None, error="HTTP 500: boom"))
        add_event(conn, held, deliver_at=now + 30 * DAY)  # a delayed event, due long after its day is gone
        add_event(conn, published)
        conn.execute("UPDATE outbox_events SET published_at = now() WHERE id = %s", (published,))
    later = now + 10 * DAY
    # A day is kept until its range ended a whole retention ago.
    assert await drop(dsn, "inbox_messages", timedelta(days=7), now + 2 * DAY) == []
    inbox = await drop(dsn, "inbox_messages", timedelta(days=7), later)
    outbox = await drop(dsn, "outbox_events", timedelta(days=7), later)
    today = f"p{now:%Y%m%d}_0000"
    assert f"inbox_messages_{today}" in [d.partition.name for d in inbox]
    assert {d.partition.name: d.moved for d in outbox}[f"outbox_events_{today}"] == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert scalar(dsn, "SELECT to_regclass(%s) IS NULL", (f"inbox_attempts_{today}",)), "attempts go with it"
        assert where(conn, "inbox_messages", "message_id", dead) == "inbox_messages_default"
        assert where(conn, "inbox_attempts", "message_id", dead) == "inbox_attempts_default"
        assert where(conn, "outbox_events", "id", held) == "outbox_events_default"
        assert scalar(dsn, "SELECT count(*) FROM outbox_events WHERE id = %s", (published,)) == 0
        assert scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE message_id = %s", (handled,)) == 0
        # The dead letter still deduplicates: a copy is no new message, and its history is whole.
        assert receive(conn, dead) == []
        rows = conn.execute(query("inbox_lock"), dict(consumer="billing", ids=[str(dead)])).fetchall()
        assert [(r[0], r[1]) for r in rows] == [(dead, "dead_lettered")]
        assert [r[2] for r in conn.execute(query("inbox_attempts"), dict(consumer="billing", id=dead))] == [
            "HTTP 500: boom"]
        # A drop cut short after its detach leaves the detached day; the next round deletes it.
        conn.execute("CREATE TABLE outbox_events_p20200101_0000_detached (LIKE outbox_events)")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await partitions.maintain(conn)
    assert scalar(dsn, "SELECT to_regclass('outbox_events_p20200101_0000_detached') IS NULL")


def test_a_consumer_refuses_a_retention_shorter_than_a_copy_can_arrive(dsn):
    env = {"SEAMQ_DATABASE_URL": dsn, "PATH": os.environ["PATH"], "SEAMQ_CONSUMER__PURGE_OLDER_THAN": "30m",
           "SEAMQ_CONSUMER__HANDLER_URL": "http://127.0.0.1:9/handle", "SEAMQ_NATS__URL": "nats://127.0.0.1:9"}
    result = subprocess.run([*SEAMQ, "consume", "--consumer", "sea__from_vibespro"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "error[INVALID_CONFIG]" in result.stderr and "purge_older_than 30m is too short" in result.stderr
    assert "Traceback" not in result.stderr


def touched(conn, name: str, params: dict) -> set[str]:
    """The partitions a statement read (a scan executed at least once), from EXPLAIN ANALYZE; its
    writes rolled back."""
    found: set[str] = set()

    def walk(node: dict) -> None:
        if node.get("Relation Name") and node.get("Actual Loops", 0) > 0 and node["Node Type"] != "ModifyTable":
            found.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    with conn.transaction(force_rollback=True):
        walk(conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query(name), params).fetchone()[0][0]["Plan"])
    return found


async def test_statements_by_id_read_only_the_partitions_their_ids_are_dated_in(dsn):
    """Run-time pruning: the relay's and the consumer's writes by id read the day of each id,
    whatever number of days exist (here today, two days ahead, legacy and default)."""
    now = datetime.now(timezone.utc)
    ids = [dated_id(now) for _ in range(3)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for day in range(3):  # 5,000 rows in each of three days, analyzed: a read of every day would show
            others = [dated_id(now + day * DAY) for _ in range(5000)]
            conn.execute("INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
                         "part) SELECT x, 'sea', 'order', 'o-1', 'order_placed', '{}', seamq_id_time(x) "
                         "FROM unnest(CAST(%s AS uuid[])) x", (others,))
            receive(conn, *others)
        conn.execute("ANALYZE outbox_events; ANALYZE inbox_messages")
        for event_id in ids:
            add_event(conn, event_id)
        receive(conn, *ids)
        today = {f"outbox_events_p{now:%Y%m%d}_0000"}
        inbox_today = {f"inbox_messages_p{now:%Y%m%d}_0000"}
        texts = [str(i) for i in ids]
        assert touched(conn, "mark_published", dict(ids=ids, seqs=[1, 2, 3])) == today
        assert touched(conn, "mark_failed", dict(ids=ids, errors=["e"] * 3, delays=[1.0] * 3,
                                                 park=[False] * 3)) == today
        assert touched(conn, "inbox_lock", dict(consumer="billing", ids=texts)) == inbox_today
        assert touched(conn, "inbox_duplicate", dict(consumer="billing", ids=texts)) == inbox_today
        assert touched(conn, "replay_mark", dict(consumer="billing", message_id=ids[0], watchdog=60)) == inbox_today
