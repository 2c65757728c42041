"""Scenario: a relay, a consumer and a producer with 50 million rows of history in each table
(issue 45), against the same with empty tables, in one run: on this version's tables, partitioned
by the time their ids tell, and on the single heaps of the previous release, run by its own code.

The history is a week of published outbox rows and handled inbox rows (83 events/s), with its
statistics taken while nothing is pending and checkpointed: what a deployment has on disk when a
backlog builds up. The previous release's history has UUIDv4 ids, as every install before 0.4 has.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nats
import psycopg

from bench.common import (
    CpuWindow, Result, bench_topology, cpu_per_row, provision, publish_events, services, spawn, stop, uuid7_at,
)
from bench.consumer import CONSUMER, reset
from bench.history import drained
from bench.relay import reset_stream
from seamq.pg import migrate, partitions
from seamq.topology import load_topology

HISTORY = 50_000_000
WEEK = timedelta(days=7)
PREVIOUS = "902bb97"  # the last commit before migration 0013: the outbox and inbox as single heaps
REPO = Path(__file__).resolve().parent.parent
CHUNK = 1_000_000  # rows per transaction while loading


@dataclass
class Layout:
    name: str
    src: str | None = None  # the previous release's sources; None: this version

    def env(self, svc, **extra) -> dict:
        return svc.env(PYTHONPATH=":".join(p for p in (self.src, str(REPO)) if p), **extra)

    @property
    def partitioned(self) -> bool:
        return self.src is None


def previous_release(root: Path) -> str:
    """The previous release's `src`, from this repository's history."""
    target = root / "previous"
    target.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS, "src"], capture_output=True,
                                 check=True).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"error: the scale scenario needs commit {PREVIOUS} (a full clone): {exc.stderr.decode()}") from None
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return str(target / "src")


async def fresh(svc, layout: Layout, name: str, history: int) -> str:
    """A database migrated by the layout's own code; this version's with dated partitions for
    the week of history too, as days passing would have made them."""
    svc.pg.drop_database(name)
    svc.dsn = svc.pg.create_database(name)
    if layout.partitioned:
        await migrate.upgrade(svc.dsn)
        if history:
            now = datetime.now(timezone.utc)
            async with await psycopg.AsyncConnection.connect(svc.dsn, autocommit=True) as conn:
                for table in ("outbox_events", "inbox_messages", "inbox_attempts"):
                    for part in await partitions.dated(conn, table):
                        await conn.execute(f"DROP TABLE {part.name}")
                await partitions.make_ahead(conn, now - WEEK)
                await partitions.make_ahead(conn, now)
    else:
        subprocess.run([sys.executable, "-m", "seamq", "db", "upgrade"], env=layout.env(svc), check=True,
                       capture_output=True)
    return svc.dsn


async def loaded(dsn: str, layout: Layout, rows: int) -> float:
    """`load` off the event loop: a run cancelled meanwhile (SIGTERM) stops it at its next chunk
    instead of waiting up to half an hour for 50 million rows to be written."""
    stop = threading.Event()
    try:
        return await asyncio.to_thread(load, dsn, layout, rows, stop)
    finally:
        stop.set()


def load(dsn: str, layout: Layout, rows: int, stop: threading.Event) -> float:
    """`rows` published outbox rows and as many handled inbox rows, over the week before the last
    hour (both tables at once), then VACUUM ANALYZE and CHECKPOINT. Seconds it took."""
    end_ms = int((datetime.now(timezone.utc) - timedelta(hours=1)).timestamp() * 1000)
    at = f"{end_ms - int(WEEK.total_seconds() * 1000)} + g * {int(WEEK.total_seconds() * 1000)}::bigint / {rows}"
    ident = uuid7_at(at) if layout.partitioned else "gen_random_uuid()"
    part = ", part" if layout.partitioned else ""
    part_value = ", seamq_id_time(x.id)" if layout.partitioned else ""
    statements = [
        "INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, occurred_at, "
        f"                           published_at, publish_attempts, stream_seq{part}) "
        "SELECT x.id, 'sea', 'order', 'h-' || (x.g %% 10000), 'order_placed', '{\"n\": 1, \"kind\": \"history\"}', "
        f"       x.at, x.at + interval '50 ms', 1, x.g{part_value} "
        f"FROM (SELECT g, {ident} AS id, timestamptz 'epoch' + ({at}) * interval '1 ms' AS at "
        "      FROM generate_series(%(lo)s, %(hi)s) g) x",
        "INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, occurred_at, "
        f"                            received_at, attempts, status, processed_at{part}) "
        f"SELECT '{CONSUMER}', x.id, 'vibespro.event.vibe_created.v1', 'vibe_created', 1, x.at, "
        f"       x.at + interval '50 ms', 1, 'processed', x.at + interval '60 ms'{part_value} "
        f"FROM (SELECT g, {ident} AS id, timestamptz 'epoch' + ({at}) * interval '1 ms' AS at "
        "      FROM generate_series(%(lo)s, %(hi)s) g) x",
    ]
    started = time.monotonic()

    def fill(statement: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for first in range(0, rows, CHUNK):
                    if stop.is_set():
                        return
                    conn.execute(statement, dict(lo=first + 1, hi=min(rows, first + CHUNK)))
                conn.execute("VACUUM ANALYZE " + statement.split()[2])
        except psycopg.OperationalError:
            if not stop.is_set():
                raise  # else the run was cancelled and its PostgreSQL stopped under the load

    threads = [threading.Thread(target=fill, args=(s,)) for s in statements]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    return time.monotonic() - started


def produce(svc, layout: Layout, count: int, per_tx: int, ids: str, kind: str) -> dict:
    """The producer probe, run by the layout's code."""
    out = subprocess.run([sys.executable, str(REPO / "bench/probes/producer.py"), svc.dsn, str(count), str(per_tx),
                          ids, kind], env=layout.env(svc), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


async def relay_catch_up(svc, layout: Layout, count: int) -> dict:
    await reset_stream(svc.nats.url)
    produce(svc, layout, count, 5000, "v7", "bench")
    rate, used = await drained(svc, spawn([sys.executable, "-m", "seamq", "relay"],
                                          layout.env(svc, SEAMQ_RELAY__BATCH_SIZE=500)), count, 1800)
    return dict(relay_events_per_s=rate, **{f"relay_{k}": v for k, v in used.items()})


async def consumer_catch_up(svc, layout: Layout, topology_file: Path, count: int, size: int) -> dict:
    nc = await nats.connect(svc.nats.url)
    await nc.jetstream().purge_stream("VIBESPRO_EVENTS")  # this run's messages alone
    await nc.close()
    await reset(svc, load_topology(topology_file))
    await publish_events(svc.nats.url, count, size)
    started = datetime.now(timezone.utc)
    env = layout.env(svc, SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                     SEAMQ_CONSUMER__BATCH_SIZE=500)
    worker = spawn([sys.executable, "-m", "seamq", "consume", "--consumer", CONSUMER], env)
    cpu = CpuWindow(consumer=(worker.pid,), pg=(svc.pg.proc.pid,))
    nc = await nats.connect(svc.nats.url)
    try:
        js = nc.jetstream()

        async def acked() -> int:
            info = await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)
            return info.ack_floor.consumer_seq

        done = [0]

        async def poll() -> None:
            while done[0] < count:
                done[0] = await acked()
                await asyncio.sleep(0.1)

        poller = asyncio.create_task(poll())
        used = await cpu_per_row(cpu, lambda: done[0], count, timeout=1800)
        await poller
    finally:
        await nc.close()
        stop(worker)
    with psycopg.connect(svc.dsn) as conn:
        n, seconds = conn.execute(
            "SELECT count(*), extract(epoch FROM max(processed_at) - min(processed_at)) FROM inbox_messages "
            "WHERE received_at >= %s", (started,)).fetchone()
    assert n == count, f"{n} of {count} messages in the inbox"
    return dict(consumer_msgs_per_s=round(n / float(seconds)), **{f"consumer_{k}": v for k, v in used.items()})


async def measure(svc, layout: Layout, topology_file: Path, history: int, count: int, size: int) -> dict:
    await fresh(svc, layout, f"scale_{layout.name}_{history}", history)
    load_s = await loaded(svc.dsn, layout, history) if history else 0.0
    row = dict(layout="partitioned (this version)" if layout.partitioned else f"single heaps ({PREVIOUS})",
               history_rows=history, load_s=round(load_s))
    # One event per transaction, as a service adds them (a commit's fsync is most of it), and 100
    # (what the index and the heap cost, seen).
    for ids in ("v7", "v4"):
        for per_tx, events in ((1, max(count // 50, 200)), (100, max(count // 2, 2000))):
            took = produce(svc, layout, events, per_tx, ids, "producer")
            row.update({f"producer_{ids}_x{per_tx}_{k}": v for k, v in took.items()})
    with psycopg.connect(svc.dsn, autocommit=True) as conn:  # the producer's rows are no backlog to measure
        conn.execute("UPDATE outbox_events SET published_at = now() WHERE payload->>'kind' = 'producer'")
    row.update(await relay_catch_up(svc, layout, count))
    row.update(await consumer_catch_up(svc, layout, topology_file, count, size))
    svc.pg.drop_database(f"scale_{layout.name}_{history}")  # the next one's disk
    return row


async def run(count: int, size: int) -> Result:
    result = Result("tables_at_scale")
    quick = count < 10_000
    history = 20 * count if quick else HISTORY
    with services() as svc:
        topology_file = bench_topology(svc.root)
        await provision(svc.nats.url, load_topology(topology_file))
        layouts = [Layout("partitioned")] + ([] if quick else [Layout("heap", previous_release(svc.root))])
        for layout in layouts:
            empty = await measure(svc, layout, topology_file, 0, count, size)
            result.add(case=f"{layout.name}, empty tables", events_per_s=empty["relay_events_per_s"], **empty)
            full = await measure(svc, layout, topology_file, history, count, size)
            ratios = {f"{k}_vs_empty": round(full[k] / empty[k], 2) for k in (
                "relay_events_per_s", "consumer_msgs_per_s", "producer_v7_x100_per_event_us_p50",
                "producer_v4_x100_per_event_us_p50")}
            result.add(case=f"{layout.name}, {history:,} rows of history in each table",
                       events_per_s=full["relay_events_per_s"], **ratios, **full)
    result.notes.append(
        "relay x1 (batch 500) drains a backlog of `count` rows; consumer x1 (in-process no-op handler, batch 500) "
        "as many messages; rates from the rows' first and last published_at / processed_at; producer: "
        "outbox.add_many, 1 or 100 events per transaction (x1, x100), UUIDv7 (seamq's) or UUIDv4 ids; the previous release runs its "
        f"own code ({PREVIOUS}, from git); the history over the week before the last hour, VACUUM ANALYZE, "
        "CHECKPOINT")
    if quick:
        result.notes.append("quick run: this version only (the previous release's layout in full runs)")
    return result
