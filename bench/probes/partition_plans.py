"""Which partitions each of seamq's statements reads (issue 45), from EXPLAIN ANALYZE on a database
with rows in today's and the two days before's partitions, each row published and handled when its
id says: `python -m bench.probes.partition_plans [rows per day]`.

The relay's statements run in its session's settings (seamq.pg.outbox_repo.relay_session), as it
runs them. A statement's writes are rolled back.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from seamq.embedded.postgres import PostgresServer
from seamq.ids import uuid7
from seamq.pg import migrate, partitions
from seamq.dead_letter import DlqFilter
from seamq.pg import dlq_repo
from seamq.pg.outbox_repo import RELAY_LOCK_CLASS
from seamq.pg.sql import query
from seamq.pipeline.pg_source import READS

DAY = timedelta(days=1)


def read(conn, sql: str, params: dict) -> tuple[list[str], int, int, float]:
    """The partitions a statement found rows in, how many it looked into (an index of each, at
    least), the pages it touched, and its time."""
    found: set[str] = set()
    probed: set[str] = set()

    def walk(node: dict) -> None:
        if node.get("Relation Name") and node.get("Actual Loops", 0) > 0 and node["Node Type"] != "ModifyTable":
            name = node["Relation Name"].split("_", 2)[-1]
            probed.add(name)
            if node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) > 0:
                found.add(name)
        for child in node.get("Plans", []):
            walk(child)

    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()[0][0]
        walk(plan["Plan"])
    pages = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
    return sorted(found), len(probed), pages, plan["Execution Time"]


async def main(per_day: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="seamq-plans-"))
    pg = PostgresServer(root / "pg", durable=False)
    pg.start()
    try:
        dsn = pg.create_database("plans")
        await migrate.upgrade(dsn)
        now = datetime.now(timezone.utc)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:  # days from 2 days ago
            for table in ("outbox_events", "inbox_messages", "inbox_attempts"):
                for made in await partitions.dated(conn, table):
                    await conn.execute(f"DROP TABLE {made.name}")
            await partitions.make_ahead(conn, now - 2 * DAY)
            await partitions.make_ahead(conn, now)
        with psycopg.connect(dsn, autocommit=True) as conn:
            today = []
            for day in (0, -1, -2):  # today and the two days before: published, handled, when their ids say
                ids = [uuid7(int((now + day * DAY).timestamp() * 1000)) for _ in range(per_day)]
                today = today or ids
                conn.execute("INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, "
                             "payload, occurred_at, published_at, part) SELECT x, 'sea', 'order', "
                             "'o-' || (random() * 1000)::int, 'order_placed', '{}', seamq_id_time(x), seamq_id_time(x), "
                             "seamq_id_time(x) FROM unnest(CAST(%s AS uuid[])) x", (ids,))
                conn.execute("INSERT INTO inbox_messages (consumer, message_id, subject, status, received_at, processed_at, part, "
                             "occurred_at) SELECT 'billing', x, 's', 'processed', seamq_id_time(x), seamq_id_time(x), seamq_id_time(x), "
                             "seamq_id_time(x) FROM unnest(CAST(%s AS uuid[])) x", (ids,))
            pending = [uuid7() for _ in range(500)]
            conn.execute("INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
                         "part) SELECT x, 'sea', 'order', 'o-' || (random() * 1000)::int, 'order_placed', '{}', "
                         "seamq_id_time(x) FROM unnest(CAST(%s AS uuid[])) x", (pending,))
            conn.execute("UPDATE inbox_messages SET status = 'dead_lettered', processed_at = NULL, dlq_metadata = "
                         "'{\"reason\": \"handler_rejected\"}' WHERE message_id = ANY(%s)", (today[:20],))
            conn.execute("ANALYZE")
        texts = [str(i) for i in today[:100]]
        statements = {
            "claim_rows (after claim_buckets)": ("BEGIN_CLAIM", {}),
            "mark_published": (query("mark_published"), dict(ids=pending, seqs=list(range(500)))),
            "outbox_backlog": (query("outbox_backlog"), {}),
            "inbox_insert (100 copies)": (query("inbox_insert"), dict(consumer="billing", items=json.dumps(
                [[t, "s", "order_placed", 1, None, None] for t in texts]))),
            "inbox_lock": (query("inbox_lock"), dict(consumer="billing", ids=texts)),
            "inbox_record": (query("inbox_record"), dict(consumer="billing", rows=json.dumps(
                [dict(id=t, state="processed", attempts=1, copies=0) for t in texts]))),
            "inbox_backlog": (query("inbox_backlog"), {}),
            "console_inbox": (query("console_inbox"), {}),
            "replay_due": (query("replay_due"), dict(limit=100)),
            "console_published": (query("console_published"), {}),
            "dlq_select (the DLQ desk)": (query("dlq_select"), dict(dlq_repo.params(DlqFilter()), limit=50)),
            "dlq_groups (the DLQ desk)": (query("dlq_groups"), dlq_repo.params(DlqFilter())),
        }
        # The Spark pipeline's reads (KPIs, the lake, reconcile), each over an hour of occurred_at, as
        # an executor reads its range (seamq.pipeline.pg_source).
        hour = dict(lo=now - timedelta(minutes=30), hi=now + timedelta(minutes=30))
        for name, spark_read in READS.items():
            statements[f"spark {name} (an hour)"] = (
                f"{spark_read.sql} AND occurred_at >= %(lo)s AND occurred_at < %(hi)s", hour)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET enable_bitmapscan = off; SET enable_seqscan = off")  # the relay's session
            for name, (sql, params) in statements.items():
                if sql == "BEGIN_CLAIM":
                    with conn.transaction(force_rollback=True):
                        conn.execute(query("claim_buckets"), dict(scan=2000, lock_class=RELAY_LOCK_CLASS, buckets=128))
                        parts, probed, pages, ms = read(conn, query("claim_rows"), dict(limit=500))
                else:
                    parts, probed, pages, ms = read(conn, sql, params)
                print(f"| `{name}` | {', '.join(parts) or '(none)'} | {probed} | {pages:,} | {ms:.1f} ms |")
                if name == "outbox_backlog":
                    conn.execute("RESET enable_bitmapscan; RESET enable_seqscan")  # the consumer's session
    finally:
        pg.stop()
        pg.remove_data()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
