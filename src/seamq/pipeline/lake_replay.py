"""Replay from the event lake (ADR-032 recoverability): lake rows -> their stream again.

For a stream that lost its history (max_age, a purge, a rebuilt cluster),
`replay` re-publishes the lake's events of a time window, optionally of one
event type, to their original subjects with their original headers. Each
gets a new Nats-Msg-Id (`lake:{id}:{run}`), so JetStream's duplicate window
cannot drop it, and keeps its id in `Seamq-Message-Id`, the inbox key: a
consumer that already processed an event skips it, one that never saw it
processes it once.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from pathlib import Path
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from seamq.nats.publisher import publish_copies
from seamq.republish import Copy
from seamq.settings import NatsSettings

def select(spark: SparkSession, lake: Path, since: datetime, until: datetime, event_type: str | None = None):
    rows = spark.read.parquet(str(lake)).where((F.col("timestamp") >= since) & (F.col("timestamp") < until))
    if event_type:
        rows = rows.where(F.col("event_type") == event_type)
    return rows.where(F.col("message_id").isNotNull()).orderBy("seq")


def replay(spark: SparkSession, *, nats: NatsSettings, lake: Path, since: datetime, until: datetime,
           event_type: str | None = None, progress: Callable[[int, int], None] = lambda done, total: None) -> int:
    """Re-publish the selected lake events; returns how many JetStream stored."""
    frame = select(spark, lake, since, until, event_type).select("subject", "headers", "payload", "message_id")
    total = frame.count()
    run = uuid.uuid4().hex[:8]
    return asyncio.run(_publish(nats, frame.toLocalIterator(), total, run, progress))


async def _publish(nats: NatsSettings, rows, total: int, run: str, progress) -> int:
    copies = (Copy(row.subject, dict(row.headers or {}), row.payload.encode(), row.message_id,
                   msg_id=f"lake:{row.message_id}:{run}") for row in rows)
    return await publish_copies(nats, copies, name="seamq-lake-replay", progress=lambda done: progress(done, total))
