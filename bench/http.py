"""Scenario 4: HTTP handler mode against a local FastAPI handler (uvicorn), vs raw httpx.

The raw baselines post the same envelopes straight to the same handler with
the same concurrency: with httpx (what the issue names) and with aiohttp
(the client seamq uses, since httpx measured 18x slower at this concurrency).
seamq's numbers include JetStream, the inbox and the ACKs. Each row has the
CPU per message of the client (the raw client, or the consumer), the
handler's uvicorn, PostgreSQL and nats-server: all share the same 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import urllib.request
import uuid
from datetime import datetime, timezone

import httpx
import psycopg

from bench.common import (
    SEAMQ, CpuWindow, Result, bench_topology, cpu_per_row, fresh_database, histogram_quantiles, per_event_us,
    provision, publish_events, self_peak_rss_mb, serve_http_app, services, spawn, stop,
)
from seamq.embedded import free_port
from seamq.topology import load_topology

CONCURRENCY = 32


def _body(size: int) -> str:
    return json.dumps({
        "message_id": "", "subject": "vibespro.event.vibe_created.v1", "event_type": "vibe_created",
        "event_version": 1, "occurred_at": datetime.now(timezone.utc).isoformat(), "correlation_id": None,
        "causation_id": None, "aggregate_type": "vibe", "aggregate_id": "v-1", "payload": {"pad": "x" * size},
    })


async def _drive(post, count: int) -> tuple[float, list[float]]:
    """`count` posts from CONCURRENCY workers; (requests/s, latency of each)."""
    latencies: list[float] = []
    queue = iter(range(count))

    async def worker():
        for _ in queue:
            started = time.perf_counter()
            await post()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return count / (time.perf_counter() - started), latencies


async def raw_httpx(url: str, count: int, size: int) -> tuple[float, list[float]]:
    body = _body(size)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
        async def post():
            response = await client.post(url, content=body.replace('""', f'"{uuid.uuid4()}"', 1),
                                         headers={"content-type": "application/json"})
            assert response.status_code == 200, response.text

        return await _drive(post, count)


async def raw_aiohttp(url: str, count: int, size: int) -> tuple[float, list[float]]:
    import aiohttp

    body = _body(size)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:
        async def post():
            async with session.post(url, data=body.replace('""', f'"{uuid.uuid4()}"', 1),
                                    headers={"content-type": "application/json"}) as response:
                await response.read()
                assert response.status == 200

        return await _drive(post, count)


async def raw_wire(url: str, count: int, size: int) -> tuple[float, list[float]]:
    """seamq's own handler client (seamq.http.wire), bare: what the consumer's calls cost on their own."""
    from seamq.http.wire import HandlerClient, Target

    body, target = _body(size), Target(url)
    client = HandlerClient(limit=CONCURRENCY)

    async def post():
        status, _ = await client.post(target, body.replace('""', f'"{uuid.uuid4()}"', 1).encode(),
                                      {"content-type": "application/json"}, 10)
        assert status == 200

    try:
        return await _drive(post, count)
    finally:
        await client.close()


async def run(count: int, size: int) -> Result:
    count = max(500, count // 5)  # HTTP is slower: a fifth of the events keeps the run short
    result = Result("http")
    port, metrics_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/handle"
    server = serve_http_app(port)
    try:
        ms = lambda v: round(v * 1000, 2)  # noqa: E731
        for name, client in (("httpx", raw_httpx), ("aiohttp", raw_aiohttp), ("seamq.http.wire", raw_wire)):
            cpu = CpuWindow(server=(server.pid,))
            cpu.start()
            started = time.process_time()
            client_rate, latencies = await client(url, count, size)
            used = {"client": time.process_time() - started, **cpu.end(), "pg": 0.0, "nats": 0.0}
            if name == "httpx":
                rate = client_rate  # the baseline
            result.add(case=f"raw {name} -> handler ({CONCURRENCY} concurrent)", msgs_per_s=round(client_rate),
                       ratio=round(client_rate / rate, 2), p50_ms=ms(statistics.median(latencies)),
                       p99_ms=ms(sorted(latencies)[int(0.99 * len(latencies))]),
                       peak_rss_mb=round(self_peak_rss_mb()), **per_event_us(used, count))
        with services() as svc:
            topology_file = bench_topology(svc.root)
            await provision(svc.nats.url, load_topology(topology_file))
            await publish_events(svc.nats.url, count, size)
            dsn = await fresh_database(svc, "http")
            env = svc.env(SEAMQ_TOPOLOGY_FILE=topology_file, SEAMQ_CONSUMER__HANDLER_URL=url,
                          SEAMQ_CONSUMER__CONCURRENCY=CONCURRENCY, SEAMQ_CONSUMER__BATCH_SIZE=500,
                          SEAMQ_METRICS_PORT=metrics_port, PYTHONPATH=os.getcwd())
            consumer = spawn([*SEAMQ, "consume", "--consumer", "sea__from_vibespro"], env)
            cpu = CpuWindow(client=(consumer.pid,), server=(server.pid,), pg=(svc.pg.proc.pid,),
                            nats=(svc.nats.proc.pid,))
            with psycopg.connect(dsn, autocommit=True) as conn:
                processed = lambda: conn.execute(  # noqa: E731
                    "SELECT count(*) FROM inbox_messages WHERE status = 'processed'").fetchone()[0]
                used = await cpu_per_row(cpu, processed, count, timeout=600)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
            rss = stop(consumer)
            with psycopg.connect(dsn) as conn:
                n, seconds = conn.execute("SELECT count(*), extract(epoch FROM max(processed_at) - "
                                          "min(processed_at)) FROM inbox_messages").fetchone()
            ours = n / float(seconds)
            q = histogram_quantiles(metrics, "seamq_consumer_handler_seconds")
            result.add(case=f"seamq consume, HTTP handler ({CONCURRENCY} lanes)", msgs_per_s=round(ours),
                       ratio=round(ours / rate, 2), p50_ms=ms(q.get(0.5, 0)), p99_ms=ms(q.get(0.99, 0)),
                       peak_rss_mb=round(rss), **used)
    finally:
        server.terminate()
        server.wait(10)
    result.notes.append("ratio is against raw httpx; latency = one handler call (seamq: from its histogram, "
                        "bucket-interpolated); uvicorn runs one worker process on the same 2 cores; cpu_us_* = CPU per message of "
                        "the client (raw client or seamq consume), uvicorn, PostgreSQL (all its processes) and "
                        "nats-server, seamq's from the first inbox row to the last")
    return result
