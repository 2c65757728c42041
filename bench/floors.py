"""Scenario 8: the floors under the consumer's and the relay's speed, each part alone.

The ratios of issues 13 and 14 compare seamq with baselines that use no
database. Whether a target fits on a machine is a sum: each part's CPU per
message at its cheapest, against 1,000,000 us a second per core. This
measures the parts that sum is made of, so that the argument in
docs/benchmarks.md can be checked on any machine:

- receive: client CPU per message of seamq's `PullSource` with an ack per
  message and nothing else, next to nats-py's `fetch` + ack (the consumer
  scenario's raw baseline, measured by the same function);
- claim and mark: PostgreSQL's CPU per row for the simplest claim and
  published mark on a table like the outbox (a row update), and for an
  immutable row with a narrow queue row deleted on publish; with what each
  design costs a producer's one-row transaction. Stripped claims (no
  per-aggregate order, backoff or deliver_at): lower bounds for either.
"""

from __future__ import annotations

import json
import time
import uuid

import nats
import psycopg
from nats.js.api import AckPolicy, ConsumerConfig

from bench.common import (
    CpuWindow, Result, bench_topology, cpu_seconds, per_event_us, provision, publish_events, services,
)
from bench.consumer import raw_fetch_ack
from seamq.nats.pull import JsDelivery, PullSource
from seamq.topology import load_topology

STREAM = "VIBESPRO_EVENTS"

SCHEMA = """
CREATE TABLE updated (id uuid PRIMARY KEY, seq bigserial, payload jsonb NOT NULL,
                      created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz);
CREATE INDEX updated_pending ON updated (seq) WHERE published_at IS NULL;
CREATE INDEX updated_published ON updated (published_at);
CREATE TABLE immutable (id uuid PRIMARY KEY, seq bigserial, payload jsonb NOT NULL,
                        created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE queue (seq bigint PRIMARY KEY, id uuid NOT NULL);
CREATE TABLE published (batch bigserial PRIMARY KEY, ids uuid[] NOT NULL,
                        published_at timestamptz NOT NULL DEFAULT now());
"""

CLAIM_AND_MARK = {
    # design: (claim, mark); the mark takes the claimed rows' first column
    "updated": [
        "SELECT id, seq, payload FROM updated WHERE published_at IS NULL ORDER BY seq LIMIT 500 "
        "FOR UPDATE SKIP LOCKED",
        "UPDATE updated SET published_at = now() FROM unnest(%s::uuid[]) AS u(id) WHERE updated.id = u.id",
    ],
    "immutable": [
        "SELECT q.seq, q.id, i.payload FROM queue q JOIN immutable i USING (id) ORDER BY q.seq LIMIT 500 "
        "FOR UPDATE OF q SKIP LOCKED",
        "WITH gone AS (DELETE FROM queue WHERE seq = ANY(%s::bigint[]) RETURNING id) "
        "INSERT INTO published (ids) SELECT array_agg(id) FROM gone",
    ],
}


async def receive(svc, count: int) -> list[dict]:
    rows = [dict(case="receive: nats-py fetch(500) + ack", **await raw_fetch_ack(svc, count))]
    nc = await nats.connect(svc.nats.url)
    js = nc.jetstream()
    for wrap in (False, True):
        durable = f"floor{len(rows)}"
        await js.add_consumer(STREAM, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                                                     max_ack_pending=1000, filter_subject="vibespro.event.>"))
        cpu = CpuWindow(nats=(svc.nats.proc.pid,))
        cpu.start()
        client, started, done = time.process_time(), time.perf_counter(), 0
        source = await PullSource(nc, STREAM, durable).start()
        while done < count:
            for msg in await source.fetch(500, 5):
                await (JsDelivery(msg) if wrap else msg).ack()
                done += 1
        await source.close()
        rate = count / (time.perf_counter() - started)
        used = {"consumer": time.process_time() - client, **cpu.end()}
        case = "PullSource + JsDelivery + ack" if wrap else "PullSource + ack"
        rows.append(dict(case=f"receive: {case}", msgs_per_s=round(rate), **per_event_us(used, count)))
    await nc.close()
    return rows


def claim_and_mark(svc, count: int, size: int) -> list[dict]:
    dsn = svc.pg.create_database("floors")
    pg = svc.pg.proc.pid
    body = json.dumps({"pad": "x" * max(0, size - 12)})
    producers = max(200, min(5000, count // 20))
    rows = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        for design, (claim, mark) in CLAIM_AND_MARK.items():
            before = cpu_seconds(pg, children=True)
            for _ in range(producers):  # producers: one-row transactions
                with conn.transaction():
                    row_id = uuid.uuid4()
                    seq = conn.execute(f"INSERT INTO {design} (id, payload) VALUES (%s, %s) RETURNING seq",
                                       (row_id, body)).fetchone()[0]
                    if design == "immutable":
                        conn.execute("INSERT INTO queue (seq, id) VALUES (%s, %s)", (seq, row_id))
            producer_us = (cpu_seconds(pg, children=True) - before) / producers * 1e6
            conn.execute(f"INSERT INTO {design} (id, payload) SELECT gen_random_uuid(), %s::jsonb "
                         "FROM generate_series(1, %s)", (body, count - producers))
            if design == "immutable":
                conn.execute("INSERT INTO queue (seq, id) SELECT seq, id FROM immutable "
                             "ON CONFLICT (seq) DO NOTHING")
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
            wal = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            before, started, done = cpu_seconds(pg, children=True), time.perf_counter(), 0
            while done < count:
                with conn.transaction():
                    claimed = conn.execute(claim).fetchall()
                    conn.execute(mark, ([r[0] for r in claimed],))
                done += len(claimed)
            rate = count / (time.perf_counter() - started)
            rows.append(dict(
                case=f"claim + mark, {'row updated' if design == 'updated' else 'immutable row + queue row'}",
                rows_per_s=round(rate), cpu_us_pg=round((cpu_seconds(pg, children=True) - before) / count * 1e6, 1),
                wal_bytes_per_row=round(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                                                     (wal,)).fetchone()[0] / count),
                producer_tx_cpu_us_pg=round(producer_us, 1)))
    return rows


async def run(count: int, size: int) -> Result:
    result = Result("floors")
    with services() as svc:
        await provision(svc.nats.url, load_topology(bench_topology(svc.root)))
        await publish_events(svc.nats.url, count, size)
        for row in await receive(svc, count) + claim_and_mark(svc, count, size):
            result.add(**row)
    result.notes.append("receive: cpu_us_consumer = the consuming process, cpu_us_nats = nats-server; claim + mark: "
                        "PostgreSQL (all its processes) per row, batches of 500; producer_tx_cpu_us_pg = PostgreSQL "
                        "per one-row producer transaction (fsync on)")
    return result
