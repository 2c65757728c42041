"""Scenario 6: FastStream's JetStream pull subscriber (a Python user's usual choice) on the
same stream, next to seamq's consumer with the inbox off and on.

Same method for all three: the consumer starts idle, then N events are
published and the clock runs until JetStream reports all N acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import time

import nats

from bench.common import (
    SEAMQ, Result, bench_topology, fresh_database, provision, publish_events, self_peak_rss_mb, services, spawn,
    stop, wait_until,
)
from seamq.topology import load_topology

STREAM = "VIBESPRO_EVENTS"


async def all_acked(nats_url: str, durable: str, count: int) -> bool:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(STREAM, durable)
        return info.ack_floor.stream_seq >= count and info.num_ack_pending == 0
    except Exception:
        return False
    finally:
        await nc.close()


async def reset_stream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    await nc.jetstream().purge_stream(STREAM)
    await nc.close()


async def faststream_rate(nats_url: str, count: int, size: int) -> float:
    from faststream.nats import JStream, NatsBroker, PullSub

    broker = NatsBroker(nats_url, logger=None)  # no per-message log lines: they cost the peer CPU
    handled = 0

    @broker.subscriber("vibespro.event.>", stream=JStream(STREAM, declare=False), durable="faststream_peer",
                       pull_sub=PullSub(batch_size=500, timeout=1.0))
    async def handle(body: dict) -> None:
        nonlocal handled
        handled += 1

    await broker.start()
    await asyncio.sleep(1.0)
    started = time.perf_counter()
    await publish_events(nats_url, count, size)
    await wait_until(lambda: all_acked(nats_url, "faststream_peer", count), timeout=600, interval=0.1)
    elapsed = time.perf_counter() - started
    await broker.stop()
    return count / elapsed


async def seamq_rate(svc, topology_file, count: int, size: int, inbox: bool) -> tuple[float, float]:
    await reset_stream(svc.nats.url)
    await fresh_database(svc, f"peer{int(inbox)}")  # sets svc.dsn for the worker
    nc = await nats.connect(svc.nats.url)
    try:
        await nc.jetstream().delete_consumer(STREAM, "sea__from_vibespro")
    except Exception:
        pass
    await nc.close()
    await provision(svc.nats.url, load_topology(topology_file))
    env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__REGISTRY="bench.handlers:REGISTRY",
                  SEAMQ_CONSUMER__BATCH_SIZE=500, SEAMQ_CONSUMER__INBOX=str(inbox).lower(), PYTHONPATH=os.getcwd())
    worker = spawn([*SEAMQ, "consume", "--consumer", "sea__from_vibespro"], env)
    await asyncio.sleep(2.0)
    started = time.perf_counter()
    await publish_events(svc.nats.url, count, size)
    await wait_until(lambda: all_acked(svc.nats.url, "sea__from_vibespro", count), timeout=600, interval=0.1)
    elapsed = time.perf_counter() - started
    return count / elapsed, stop(worker)


async def run(count: int, size: int) -> Result:
    result = Result("peer")
    with services() as svc:
        topology_file = bench_topology(svc.root)
        await provision(svc.nats.url, load_topology(topology_file))
        peer = await faststream_rate(svc.nats.url, count, size)
        result.add(case="FastStream pull subscriber (no-op handler)", msgs_per_s=round(peer), ratio=1.0,
                   peak_rss_mb=round(self_peak_rss_mb()))
        for inbox in (False, True):
            rate, rss = await seamq_rate(svc, topology_file, count, size, inbox)
            result.add(case=f"seamq consume, inbox {'on (exactly-once)' if inbox else 'off (at-least-once)'}",
                       msgs_per_s=round(rate), ratio=round(rate / peer, 2), peak_rss_mb=round(rss))
    result.notes.append("rate = N / (publish start -> JetStream reports all N acked); publishing runs ~50k/s")
    return result
