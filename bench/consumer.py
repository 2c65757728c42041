"""Scenario 2: JetStream -> inbox -> in-process no-op handler -> ACK, vs raw fetch + ack.

1 and 2 consumer processes share one durable consumer. The raw baseline is
one nats-py process fetching from an identical durable consumer and ACKing
each message, with no database. Each row also has the CPU per message of
the consumer processes (or the raw client), PostgreSQL and nats-server:
on a small box the ratios are set by what all three spend together.
"""

from __future__ import annotations

import time

import nats
import psycopg
from nats.js.api import AckPolicy, ConsumerConfig

from bench.common import (
    SEAMQ, CpuWindow, Result, bench_topology, cpu_per_row, fresh_database, per_event_us, provision,
    publish_events, self_peak_rss_mb, services, spawn, stop,
)
from seamq.topology import load_topology

CONSUMER = "sea__from_vibespro"


async def raw_fetch_ack(svc, count: int, batch: int = 500) -> dict:
    """Rate and CPU per message (this process, nats-server) of nats-py's fetch + ack."""
    cpu = CpuWindow(nats=(svc.nats.proc.pid,))
    nc = await nats.connect(svc.nats.url)
    js = nc.jetstream()
    await js.add_consumer("VIBESPRO_EVENTS", ConsumerConfig(durable_name="raw_baseline", ack_policy=AckPolicy.EXPLICIT,
                                                           max_ack_pending=1000, filter_subject="vibespro.event.>"))
    sub = await js.pull_subscribe_bind(durable="raw_baseline", stream="VIBESPRO_EVENTS")
    done = 0
    cpu.start()
    client = time.process_time()
    started = time.perf_counter()
    while done < count:
        for msg in await sub.fetch(batch, timeout=5):
            await msg.ack()
            done += 1
    elapsed = time.perf_counter() - started
    used = {"consumer": time.process_time() - client, "pg": 0.0, **cpu.end()}
    await nc.close()
    return dict(msgs_per_s=round(count / elapsed), **per_event_us(used, count))


async def reset(svc, topology) -> None:
    nc = await nats.connect(svc.nats.url)
    try:
        await nc.jetstream().delete_consumer("VIBESPRO_EVENTS", CONSUMER)
    except Exception:
        pass
    await nc.close()
    await provision(svc.nats.url, topology)


def inbox_rate(dsn: str) -> float:
    with psycopg.connect(dsn) as conn:
        n, seconds = conn.execute("SELECT count(*), extract(epoch FROM max(processed_at) - min(processed_at)) "
                                  "FROM inbox_messages WHERE status = 'processed'").fetchone()
    return n / float(seconds) if seconds else float("nan")


async def run(count: int, size: int) -> Result:
    result = Result("consumer")
    with services() as svc:
        topology_file = bench_topology(svc.root)
        topology = load_topology(topology_file)
        await provision(svc.nats.url, topology)
        await publish_events(svc.nats.url, count, size)
        measured = await raw_fetch_ack(svc, count)
        raw = measured["msgs_per_s"]
        result.add(case="raw fetch + ack (nats-py; cpu_us_consumer: the client)", ratio=1.0,
                   peak_rss_mb=round(self_peak_rss_mb()), **measured)
        for processes in (1, 2):
            await reset(svc, topology)
            dsn = await fresh_database(svc, f"consumer{processes}")
            env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                          SEAMQ_CONSUMER__BATCH_SIZE=500, PYTHONPATH=str(svc.root.parent) + ":" + _repo())
            workers = [spawn([*SEAMQ, "consume", "--consumer", CONSUMER], env) for _ in range(processes)]
            cpu = CpuWindow(consumer=tuple(w.pid for w in workers), pg=(svc.pg.proc.pid,), nats=(svc.nats.proc.pid,))
            with psycopg.connect(dsn, autocommit=True) as conn:
                rows = lambda: conn.execute("SELECT count(*) FROM inbox_messages").fetchone()[0]  # noqa: E731
                used = await cpu_per_row(cpu, rows, count, timeout=900)
            rss = max(stop(w) for w in workers)
            rate = inbox_rate(dsn)
            result.add(case=f"seamq consume x{processes} (inbox + no-op in-process handler)",
                       msgs_per_s=round(rate), ratio=round(rate / raw, 2), peak_rss_mb=round(rss), **used)
    result.notes.append("consumer rate = rows / (last processed_at - first processed_at); max_ack_pending 1000; "
                        "cpu_us_* = CPU per message of the consumer processes (or the raw client), PostgreSQL (all "
                        "its processes) and nats-server, from the first inbox row to the last")
    return result


def _repo() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parent.parent)
