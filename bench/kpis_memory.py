"""KPIs over a large outbox and inbox: the Spark driver's peak memory when the executors
read PostgreSQL (seamq.pipeline.pg_source), against reading every row through the
driver (what `seamq pipeline kpis` did before: psycopg -> Arrow -> createDataFrame).

    python -m bench.kpis_memory --rows 1000000

Each case runs in a process of its own (local[2]), so its peak is its own: the
driver's Python process (VmHWM) and its JVM, which in local mode also hosts
the executors' JVM side. Rows are spread evenly over 24 hours; the window
case asks for one hour. Not part of `make bench` (seeding 2 x 1M rows takes
about a minute); numbers in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

DAY = "2026-11-20 00:00:00+00"
CASES = {
    "driver-side read, all rows (before)": "driver",
    "executors read, all rows": "executors",
    "executors read, one-hour window": "window",
}


def seed(dsn: str, rows: int) -> None:
    import psycopg

    spread = f"'{DAY}'::timestamptz + (i * 86400.0 / {rows}) * interval '1 second'"
    with psycopg.connect(dsn) as conn:
        conn.execute(f"""
            INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload,
                                       occurred_at, created_at, published_at)
            SELECT gen_random_uuid(), 'sea', 'order', 'o-' || (i % 1000), 'order_placed', '{{}}', t, t,
                   t + (i % 50) * interval '1 millisecond'
            FROM generate_series(1, {rows}) AS i, LATERAL (SELECT {spread} AS t) x""")
        conn.execute(f"""
            INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, status,
                                        occurred_at, received_at, processed_at)
            SELECT 'vibespro__from_sea', gen_random_uuid(), 'sea.event.order_placed.v1', 'order_placed', 1,
                   'processed', t, t, t + (i % 200) * interval '1 millisecond'
            FROM generate_series(1, {rows}) AS i, LATERAL (SELECT {spread} AS t) x""")
    with psycopg.connect(dsn, autocommit=True) as conn:  # summarises the BRIN ranges, as autovacuum would
        conn.execute("VACUUM ANALYZE outbox_events")
        conn.execute("VACUUM ANALYZE inbox_messages")


def driver_side_frame(spark, dsn: str, sql: str):
    """The read `seamq pipeline kpis` used before: every row through the driver."""
    import psycopg
    import pyarrow as pa

    with psycopg.connect(dsn) as conn:
        cur = conn.execute(sql)
        names = [c.name for c in cur.description]
        rows = cur.fetchall()
    return spark.createDataFrame(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}))


def case(kind: str, dsn: str) -> dict:
    """Run in a child process: compute the KPIs, return rows and peak memory."""
    from datetime import datetime, timezone

    from seamq.pipeline import kpis
    from seamq.pipeline.spark import session

    spark = session("local[2]", app=f"kpis-{kind}")
    started = time.perf_counter()
    if kind == "driver":
        from seamq.pipeline import pg_source

        reads = {"outbox_kpis": None, "inbox_kpis": None}
        for name in reads:
            reads[name] = driver_side_frame(spark, dsn, pg_source.READS[name].sql)
        original = pg_source.read
        pg_source.read = lambda spark, dsn, name, *args: reads[name]  # the same aggregation, the old read
        try:
            rows = kpis.compute(spark, dsn).collect()
        finally:
            pg_source.read = original
    elif kind == "executors":
        rows = kpis.compute(spark, dsn).collect()
    else:
        hour = datetime(2026, 11, 20, 12, tzinfo=timezone.utc)
        rows = kpis.compute(spark, dsn, hour, hour.replace(hour=13)).collect()
    elapsed = time.perf_counter() - started
    me = psutil.Process()
    jvm = max((p for p in me.children(recursive=True) if "java" in p.name()), key=lambda p: p.memory_info().rss)
    result = {"kpi_rows": len(rows), "events": sum(r.outbox_total for r in rows), "seconds": round(elapsed, 1),
              "driver_python_peak_mb": _hwm(me.pid), "jvm_peak_mb": _hwm(jvm.pid)}
    spark.stop()
    return result


def _hwm(pid: int) -> int:
    """Peak resident memory of a process so far, MB (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--case", choices=sorted(set(CASES.values())))
    parser.add_argument("--dsn")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(args.case, args.dsn)))
        return
    from seamq.embedded import PostgresServer
    from seamq.pg import migrate
    import asyncio

    root = Path(tempfile.mkdtemp(prefix="seamq-kpis-bench-"))
    server = PostgresServer(root / "data", durable=False)
    server.start()
    try:
        dsn = server.create_database("bench")
        asyncio.run(migrate.upgrade(dsn))
        started = time.perf_counter()
        seed(dsn, args.rows)
        print(f"seeded {args.rows} outbox and {args.rows} inbox rows in {time.perf_counter() - started:.0f} s")
        print("| case | KPI rows | events counted | seconds | driver Python peak MB | driver JVM peak MB |")
        print("|---|---|---|---|---|---|")
        for title, kind in CASES.items():
            out = subprocess.run([sys.executable, "-m", "bench.kpis_memory", "--case", kind, "--dsn", dsn],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            print(f"| {title} | {r['kpi_rows']} | {r['events']} | {r['seconds']} | {r['driver_python_peak_mb']} "
                  f"| {r['jvm_peak_mb']} |", flush=True)
    finally:
        server.remove_data()


if __name__ == "__main__":
    main()
