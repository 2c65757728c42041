"""The console's pages over a large inbox: how long `seamq console` takes to answer the overview
(and the dead-letter list) with 1M inbox rows, 100k of them dead letters.

    python -m bench.console --rows 1000000 --dead 100000

Rows are spread over the last 24 hours (the last minute holds 100 a second, as a busy consumer's
would); dead letters have five causes. The console runs as its own process (`seamq console`),
and each page is asked for one at a time over HTTP, as a browser would, after two warm-up
requests: the times are the client's, request sent to body read. Not part of `make bench`
(seeding takes about a minute); numbers in docs/benchmarks.md, "The console".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request

from bench.common import fresh_database, provision, services, spawn, stop
from seamq.embedded import free_port

CAUSES = ["handler_rejected: HTTP 422: total must be positive (order {n})",
          "max_deliver: handler_error: TimeoutError after 30 s",
          "invalid_json: payload is not JSON: Expecting value: line 1 column {n}",
          "handler_rejected: HTTP 422: unknown customer c-{n}",
          "no_handler: no handler for order_refunded.v3"]


def seed(dsn: str, rows: int, dead: int) -> None:
    import psycopg

    processed = rows - dead
    recent = 6000  # the last minute: 100 handled a second
    with psycopg.connect(dsn) as conn:
        conn.execute(f"""
            INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, status,
                                        occurred_at, received_at, processed_at)
            SELECT CASE WHEN i % 2 = 0 THEN 'sea__from_vibespro' ELSE 'vibespro__from_sea' END,
                   gen_random_uuid(), 'sea.event.order_placed.v1', 'order_placed', 1, 'processed', t, t,
                   t + (i % 200) * interval '1 millisecond'
            FROM generate_series(1, {processed - recent}) AS i,
                 LATERAL (SELECT now() - interval '24 hours' + (i * 86300.0 / {processed}) * interval '1 second'
                          AS t) x""")
        conn.execute(f"""
            INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, status,
                                        occurred_at, received_at, processed_at)
            SELECT 'sea__from_vibespro', gen_random_uuid(), 'vibespro.event.vibe_created.v1', 'vibe_created', 1,
                   'processed', t, t, t + (i % 50) * interval '1 millisecond'
            FROM generate_series(1, {recent}) AS i,
                 LATERAL (SELECT now() - (i * 60.0 / {recent}) * interval '1 second' AS t) x""")
        errors = "ARRAY[" + ",".join("'" + c.replace("'", "''") + "'" for c in CAUSES) + "]"
        conn.execute(f"""
            INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, status,
                                        attempts, last_error, occurred_at, received_at, dlq_metadata)
            SELECT CASE WHEN i % 3 = 0 THEN 'vibespro__from_sea' ELSE 'sea__from_vibespro' END,
                   gen_random_uuid(), 'sea.event.order_placed.v1', 'order_placed', 1, 'dead_lettered', 4,
                   replace(e, '{{n}}', (i % 977)::text), t, t,
                   jsonb_build_object('reason', split_part(e, ':', 1), 'dead_lettered_at', t, 'dlq_seq', i)
            FROM generate_series(1, {dead}) AS i,
                 LATERAL (SELECT now() - interval '24 hours' + (i * 86000.0 / {dead}) * interval '1 second' AS t,
                                 ({errors})[1 + i % 5] AS e) x""")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE inbox_messages")


def timed(url: str, count: int) -> list[float]:
    out = []
    for _ in range(count + 2):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as answer:
            answer.read()
        out.append((time.perf_counter() - started) * 1000)
    return out[2:]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    with services() as svc:
        dsn = await fresh_database(svc, "console_bench")
        await provision(svc.nats.url)
        started = time.monotonic()
        seed(dsn, args.rows, args.dead)
        print(f"seeded {args.rows} inbox rows ({args.dead} dead letters) in {time.monotonic() - started:.0f} s")
        port = free_port()
        console = spawn([sys.executable, "-m", "seamq", "console", "--port", str(port)], svc.env())
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(url + "/login", timeout=2).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline and console.poll() is None, "seamq console did not start"
                    await asyncio.sleep(0.2)
            for page in ("/", "/overview/live", "/dead-letters"):
                ms = sorted(timed(url + page, args.requests if page != "/dead-letters" else 10))
                p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
                print(f"{page:16} {len(ms)} requests: p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, "
                      f"max {ms[-1]:.1f} ms")
        finally:
            stop(console)


if __name__ == "__main__":
    asyncio.run(main())
