"""Scenario 5: the Spark JetStream source (local[2]) vs one raw nats-py reader on the same stream.

The raw reader is what a Python user would write: an ephemeral pull consumer
without acks, fetch(1000) until the stream is read. Spark's time is one
count() over the stream after the session is up (JVM start excluded).
"""

from __future__ import annotations

import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.common import Result, provision, publish_events, self_peak_rss_mb, services


async def raw_reader(nats_url: str, count: int) -> float:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sub = await js.pull_subscribe("vibespro.event.>", stream="VIBESPRO_EVENTS", config=ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=10))
    started = time.perf_counter()
    seen = 0
    while seen < count:
        seen += len(await sub.fetch(1000, timeout=5))
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


async def run(count: int, size: int) -> Result:
    from seamq.pipeline.spark import session

    result = Result("spark")
    with services() as svc:
        await provision(svc.nats.url)
        await publish_events(svc.nats.url, count, size)
        raw = await raw_reader(svc.nats.url, count)
        result.add(case="raw nats-py reader (fetch 1000, no acks)", rows_per_s=round(raw), ratio=1.0,
                   peak_rss_mb=round(self_peak_rss_mb()))
        spark = session("local[2]", app="seamq-bench")
        try:
            df = spark.read.format("jetstream").option("url", svc.nats.url).option("stream", "VIBESPRO_EVENTS") \
                .option("numPartitions", "2").load()
            df.count()  # warm the Python workers once
            started = time.perf_counter()
            rows = df.count()
            elapsed = time.perf_counter() - started
        finally:
            spark.stop()
        assert rows == count, f"Spark read {rows} of {count}"
        rate = rows / elapsed
        result.add(case="Spark jetstream source, local[2], 2 partitions", rows_per_s=round(rate),
                   ratio=round(rate / raw, 2), peak_rss_mb=round(self_peak_rss_mb()))
    result.notes.append("peak RSS is the bench process (the Spark JVM and its Python workers are not counted)")
    return result
