"""Scenario 1: outbox -> JetStream with 1 and 2 relay processes, vs raw pipelined publish.

With each, the CPU per event of the relay (or raw publisher), PostgreSQL and
nats-server. Then the relay's latency from commit to published under offered
load, what the relay's wake-up costs producers (16 writers, pgbench), and what
JetStream's `sync_interval: always` (fsync per write) costs the raw publisher.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import subprocess
import time
import uuid

import nats
import psycopg

from bench.common import (
    SEAMQ, CpuWindow, Result, cpu_per_row, fresh_database, per_event_us, provision, self_peak_rss_mb, services,
    spawn, stop, write_outbox,
)
from bench.e2e import offer, percentile
from seamq.embedded import postgres_bin_dir
from seamq.nats.fast_batch import server_batches
from seamq.nats.provision import stream_config
from seamq.topology import load_topology


async def raw_publish(nats_url: str, count: int, size: int, window: int = 1000) -> float:
    """Pipelined publishes with one wildcard reply subscription; msgs/s, acks included."""
    nc = await nats.connect(nats_url)
    body = json.dumps({"n": 0, "pad": "x" * max(0, size - 20)}).encode()
    prefix = nc.new_inbox()
    done = asyncio.Event()
    acked = 0

    async def on_ack(msg):
        nonlocal acked
        acked += 1
        if acked == count:
            done.set()

    await nc.subscribe(f"{prefix}.*", cb=on_ack)
    counter = itertools.count()
    started = time.perf_counter()
    for i in range(count):
        await nc.publish("sea.event.order_placed.v1", body, reply=f"{prefix}.{next(counter)}",
                         headers={"Nats-Msg-Id": str(uuid.uuid4())})
        if i % window == window - 1:
            await nc.flush()
            while acked < i - window:  # keep at most ~2 windows in flight, as the relay does
                await asyncio.sleep(0)
    await asyncio.wait_for(done.wait(), 60)
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


async def reset_stream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    spec = load_topology().contexts["sea"].stream
    try:
        await js.delete_stream(spec.name)
    except Exception:
        pass
    await js.add_stream(stream_config(spec, batched=server_batches(nc)))  # as `seamq provision` makes it
    await nc.close()


def relay_rate(dsn: str) -> float:
    with psycopg.connect(dsn) as conn:
        n, seconds = conn.execute(
            "SELECT count(*), extract(epoch FROM max(published_at) - min(published_at)) FROM outbox_events"
        ).fetchone()
    return n / float(seconds) if seconds else float("nan")


async def relay_processes(svc, processes: int, count: int, size: int) -> dict:
    """`processes` relays drain `count` rows; rate, RSS and CPU per event from the first
    row published to the last (process start excluded)."""
    await reset_stream(svc.nats.url)
    dsn = await fresh_database(svc, f"relay{processes}")
    write_outbox(dsn, count, size)
    relays = [spawn([*SEAMQ, "relay"], svc.env(SEAMQ_RELAY__BATCH_SIZE=500)) for _ in range(processes)]
    cpu = CpuWindow(relay=tuple(p.pid for p in relays), pg=(svc.pg.proc.pid,), nats=(svc.nats.proc.pid,))
    with psycopg.connect(dsn, autocommit=True) as conn:
        published = lambda: count - conn.execute(  # noqa: E731  (the pending index: cheap to poll)
            "SELECT count(*) FROM outbox_events WHERE published_at IS NULL").fetchone()[0]
        used = await cpu_per_row(cpu, published, count, timeout=600)
    rss = max(stop(p) for p in relays)
    return dict(events_per_s=round(relay_rate(dsn)), peak_rss_mb=round(rss), **used)


async def latency(svc, rates: list[int], seconds: float, size: int) -> Result:
    """Open-loop offered load (bench.e2e's writer), one relay: commit -> published_at."""
    result = Result("relay_latency")
    dsn = await fresh_database(svc, "relay_latency")
    relay = spawn([*SEAMQ, "relay"], svc.env())
    cpu = CpuWindow(relay=(relay.pid,), pg=(svc.pg.proc.pid,))
    try:
        await asyncio.sleep(2.0)  # connected and asleep
        await offer(dsn, 500, min(3.0, seconds), size)  # warm-up, not measured
        for rate in rates:
            cpu.start()
            commits, achieved = await offer(dsn, rate, seconds, size)
            used = cpu.end()
            with psycopg.connect(dsn, autocommit=True) as conn:
                query = ("SELECT id, extract(epoch FROM published_at) FROM outbox_events "
                         "WHERE id = ANY(%s::uuid[]) AND published_at IS NOT NULL")
                # Every offered event published, or 60 s: a busy machine's relay is late, not absent.
                deadline = time.monotonic() + 60
                while len(rows := conn.execute(query, (list(commits),)).fetchall()) < len(commits) and \
                        time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
            ms = sorted((float(t) - commits[str(i)]) * 1000 for i, t in rows) or [float("nan")]
            result.add(offered_per_s=rate, achieved_per_s=round(achieved), published=len(rows),
                       p50_ms=round(statistics.median(ms), 1), p99_ms=round(percentile(ms, 0.99), 1),
                       max_ms=round(ms[-1], 1), relay_cpu_pct=round(used["relay"] / seconds * 100),
                       pg_cpu_pct=round(used["pg"] / seconds * 100))
    finally:
        stop(relay)
    result.notes.append("latency = outbox published_at (set after JetStream's ack) - the writer's clock after its "
                        "commit; cpu % over the offered period (the writer's own PostgreSQL work included)")
    return result


PGBENCH_SCRIPT = """\\set aid random(1, 1000)
BEGIN;
INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload)
  VALUES (gen_random_uuid(), 'sea', 'order', 'o-' || :aid, 'order_placed', '{"n": 1, "kind": "bench"}');
COMMIT;
"""
NOTIFY_ALWAYS = """CREATE OR REPLACE FUNCTION seamq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('seamq_outbox', ''); RETURN NULL; END $$"""


async def producer_commits(svc, seconds: int, clients: int = 16) -> Result:
    """One-row outbox transactions from `clients` pgbench connections: what the relay's wake-up
    costs producers. Every transaction NOTIFYing serialises commits (a cluster-wide lock held
    through the commit); seamq's trigger notifies only while a relay sleeps."""
    result = Result("producer_commits")
    dsn = await fresh_database(svc, "producers")
    script = svc.root / "producers.sql"
    script.write_text(PGBENCH_SCRIPT)
    ours = psycopg.connect(dsn, autocommit=True).execute(
        "SELECT pg_get_functiondef('seamq_outbox_notify'::regproc)").fetchone()[0]
    cases = [("no trigger (no wake-up at all)", None, "DISABLE", False),
             ("NOTIFY per transaction (seamq before)", NOTIFY_ALWAYS, "ENABLE", False),
             ("seamq, relays working", ours, "ENABLE", False),
             ("seamq, a relay asleep", ours, "ENABLE", True)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for case, function, trigger, asleep in cases:
            if function:
                conn.execute(function)
            conn.execute(f"ALTER TABLE outbox_events {trigger} TRIGGER trg_outbox_notify")
            conn.execute("TRUNCATE outbox_events")
            conn.execute("CHECKPOINT")
            if asleep:
                conn.execute("SELECT pg_advisory_lock(7105, 0)")  # as a sleeping relay registers
            out = await asyncio.to_thread(subprocess.run, [
                str(postgres_bin_dir() / "pgbench"), "-n", "-c", str(clients), "-j", "2", "-T", str(seconds),
                "-f", str(script), dsn], capture_output=True, text=True)
            if asleep:
                conn.execute("SELECT pg_advisory_unlock(7105, 0)")
            tps = [line for line in out.stdout.splitlines() if line.startswith("tps")]
            if not tps:
                raise RuntimeError(f"pgbench failed: {out.stderr[-2000:]}")
            result.add(case=case, commits_per_s=round(float(tps[0].split("=")[1].split()[0])))
    result.notes.append(f"pgbench, {clients} clients, {seconds} s each, one-row transactions, fsync on")
    return result


async def raw_publish_measured(svc, count: int, size: int) -> dict:
    cpu = CpuWindow(nats=(svc.nats.proc.pid,))
    cpu.start()
    client = time.process_time()
    rate = await raw_publish(svc.nats.url, count, size)
    used = {"relay": time.process_time() - client, "pg": 0.0, **cpu.end()}
    return dict(events_per_s=round(rate), peak_rss_mb=round(self_peak_rss_mb()), **per_event_us(used, count))


async def run(count: int, size: int) -> list[Result]:
    result = Result("relay")
    quick = count < 10_000
    with services() as svc:
        await provision(svc.nats.url)
        measured = await raw_publish_measured(svc, count, size)
        raw = measured["events_per_s"]
        result.add(case="raw pipelined publish (nats-py; cpu_us_relay: the publisher)", ratio=1.0, **measured)
        for processes in (1, 2):
            row = await relay_processes(svc, processes, count, size)
            rate = row.pop("events_per_s")
            result.add(case=f"relay x{processes}", ratio=round(rate / raw, 2), events_per_s=rate, **row)
        timed = await latency(svc, [1000, 2000] if quick else [1000, 2000, 5000], 2.0 if quick else 8.0, size)
        producers = await producer_commits(svc, 1 if quick else 5)
    with services(nats_sync="always") as svc:
        await provision(svc.nats.url)
        always = await raw_publish_measured(svc, max(2000, count // 4), size)
        result.add(case="raw publish, JetStream sync_interval=always",
                   ratio=round(always["events_per_s"] / raw, 2), **always)
    result.notes.append("relay rate = rows / (last published_at - first published_at): excludes process start; "
                        "cpu_us_* = CPU per event of the relay processes (or raw publisher), PostgreSQL (all its "
                        "processes) and nats-server, from the first row published to the last")
    return [result, timed, producers]
