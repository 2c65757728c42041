"""Scenario 1: outbox -> JetStream with 1 and 2 relay processes, vs raw pipelined publish.

Also measures what JetStream's `sync_interval: always` (fsync per write)
costs, on the raw publisher, since that decides the broker's durability.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid

import nats
import psycopg

from bench.common import (
    SEAMQ, Result, fresh_database, provision, self_peak_rss_mb, services, spawn, stop, wait_until, write_outbox,
)
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


async def run(count: int, size: int) -> Result:
    result = Result("relay")
    with services() as svc:
        await provision(svc.nats.url)
        raw = await raw_publish(svc.nats.url, count, size)
        result.add(case="raw pipelined publish (nats-py)", events_per_s=round(raw), ratio=1.0,
                   peak_rss_mb=round(self_peak_rss_mb()))
        for processes in (1, 2):
            await reset_stream(svc.nats.url)
            dsn = await fresh_database(svc, f"relay{processes}")
            write_outbox(dsn, count, size)
            relays = [spawn([*SEAMQ, "relay"], svc.env(SEAMQ_RELAY__BATCH_SIZE=500)) for _ in range(processes)]
            unpublished = lambda: psycopg.connect(dsn).execute(  # noqa: E731
                "SELECT count(*) = 0 FROM outbox_events WHERE published_at IS NULL").fetchone()[0]
            await wait_until(unpublished, timeout=600, interval=0.2)
            rss = max(stop(p) for p in relays)
            rate = relay_rate(dsn)
            result.add(case=f"relay x{processes}", events_per_s=round(rate), ratio=round(rate / raw, 2),
                       peak_rss_mb=round(rss))
    with services(nats_sync="always") as svc:
        await provision(svc.nats.url)
        always = await raw_publish(svc.nats.url, max(2000, count // 4), size)
        result.add(case="raw publish, JetStream sync_interval=always", events_per_s=round(always),
                   ratio=round(always / raw, 2), peak_rss_mb=round(self_peak_rss_mb()))
    result.notes.append("relay rate = rows / (last published_at - first published_at): excludes process start")
    return result
