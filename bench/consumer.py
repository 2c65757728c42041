"""Scenario 2: JetStream -> inbox -> in-process no-op handler -> ACK, vs raw fetch + ack.

1 and 2 consumer processes share one durable consumer. The raw baseline is
one nats-py process fetching from an identical durable consumer and ACKing
each message, with no database.
"""

from __future__ import annotations

import time

import nats
import psycopg
from nats.js.api import AckPolicy, ConsumerConfig

from bench.common import (
    SEAMQ, Result, bench_topology, fresh_database, provision, publish_events, self_peak_rss_mb, services, spawn,
    stop, wait_until,
)
from seamq.topology import load_topology

CONSUMER = "sea__from_vibespro"


async def raw_fetch_ack(nats_url: str, count: int, batch: int = 500) -> float:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_consumer("VIBESPRO_EVENTS", ConsumerConfig(durable_name="raw_baseline", ack_policy=AckPolicy.EXPLICIT,
                                                           max_ack_pending=1000, filter_subject="vibespro.event.>"))
    sub = await js.pull_subscribe_bind(durable="raw_baseline", stream="VIBESPRO_EVENTS")
    done = 0
    started = time.perf_counter()
    while done < count:
        for msg in await sub.fetch(batch, timeout=5):
            await msg.ack()
            done += 1
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


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
        raw = await raw_fetch_ack(svc.nats.url, count)
        result.add(case="raw fetch + ack (nats-py)", msgs_per_s=round(raw), ratio=1.0,
                   peak_rss_mb=round(self_peak_rss_mb()))
        for processes in (1, 2):
            await reset(svc, topology)
            dsn = await fresh_database(svc, f"consumer{processes}")
            env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                          SEAMQ_CONSUMER__BATCH_SIZE=500, PYTHONPATH=str(svc.root.parent) + ":" + _repo())
            workers = [spawn([*SEAMQ, "consume", "--consumer", CONSUMER], env) for _ in range(processes)]
            processed = lambda: psycopg.connect(dsn).execute(  # noqa: E731
                "SELECT count(*) >= %s FROM inbox_messages", (count,)).fetchone()[0]
            await wait_until(processed, timeout=900, interval=0.2)
            rss = max(stop(w) for w in workers)
            rate = inbox_rate(dsn)
            result.add(case=f"seamq consume x{processes} (inbox + no-op in-process handler)",
                       msgs_per_s=round(rate), ratio=round(rate / raw, 2), peak_rss_mb=round(rss))
    result.notes.append("consumer rate = rows / (last processed_at - first processed_at); max_ack_pending 1000")
    return result


def _repo() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parent.parent)
