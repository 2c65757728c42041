"""Reconcile the outbox, the streams and the inboxes; repair what a broker lost.

Anti-joins in Spark:
- published in the outbox but missing from its stream (broker-side loss:
  JetStream's default lazy fsync can lose acknowledged writes), leaving out
  rows whose stream sequence is below the stream's first (aged out by limits).
  A row published in a fast batch holds its batch's last sequence ("stored
  at or before"), so once the stream's front has aged out, the one batch that
  straddles its first message could look missing: only that batch's rows
  (those holding the lowest sequence at or after the first) are not judged,
  and while nothing has left the front (first sequence 1) every row is.
  A time window around the first message did this before, and hid real
  losses after a bulk catch-up, when a whole backlog shares one minute;
- in a stream but never processed (nor dead-lettered) by a consumer of it,
  leaving out the last `grace` seconds (still in flight).

`repair` re-publishes the missing events from their outbox rows. Each gets a
Nats-Msg-Id of its own (`repair:{id}`), because JetStream may still hold the
original id in its duplicate window and would drop the repair, while
`Seamq-Message-Id` keeps the outbox id, which is the inbox key: a consumer
that had processed the event skips it. This is why published outbox rows are
kept longer than the reconcile interval (docs/operations.md).

PostgreSQL is read by the executors, in parallel time ranges (seamq.pipeline.pg_source).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import SparkSession

from seamq.model import Header
from seamq.nats import jsapi
from seamq.nats.connect import connect
from seamq.nats.publisher import publish_copies
from seamq.pipeline.source import source_options
from seamq.pipeline import pg_source
from seamq.republish import repair_copy
from seamq.settings import NatsSettings
from seamq.topology import Topology



@dataclass
class Report:
    missing_from_stream: dict[str, list[str]] = field(default_factory=dict)  # stream -> outbox ids
    unprocessed: dict[str, list[str]] = field(default_factory=dict)  # consumer -> message ids
    repaired: int = 0

    def to_json(self) -> dict:
        return {"missing_from_stream": self.missing_from_stream, "unprocessed": self.unprocessed,
                "repaired": self.repaired}


async def _first_seq(nats: NatsSettings, stream: str) -> int:
    """The stream's first sequence: 1 until something leaves its front (limits, a purge)."""
    nc = await connect(nats, name="seamq-reconcile", persistent=False)
    try:
        state = (await jsapi.call(nc, f"STREAM.INFO.{stream}") or {}).get("state", {})
    finally:
        await nc.close()
    return state.get("first_seq", 0)


def reconcile(spark: SparkSession, *, dsn: str, nats: NatsSettings, topology: Topology, grace: float = 60.0,
              repair: bool = False, since: datetime | None = None, until: datetime | None = None) -> Report:
    """Events that occurred in [since, until) (default: all): each side is judged by the event's own
    time, the stream's messages by their `Seamq-Occurred-At` header, so the window cuts all alike."""
    from pyspark.sql import functions as F

    report = Report()
    outbox = pg_source.read(spark, dsn, "outbox_published", since, until)
    inbox = pg_source.read(spark, dsn, "inbox_settled", since, until)
    occurred = F.to_timestamp(F.col("headers")[Header.OCCURRED_AT])
    in_window = F.lit(True)
    if since:
        in_window &= occurred >= F.lit(since)
    if until:
        in_window &= occurred < F.lit(until)
    missing_rows = []
    for context, spec in sorted(topology.contexts.items()):
        name = spec.stream.name
        stream = spark.read.format("jetstream").options(**source_options(nats)).option("stream", name).load() \
            .where(in_window).select("message_id", "timestamp").cache()
        first_seq = asyncio.run(_first_seq(nats, name))
        published = outbox.where((F.col("context") == context) & (F.col("stream_seq") >= first_seq))
        if first_seq > 1:  # the front aged out: the batch across the edge may be partly gone, by right
            edge = published.agg(F.min("stream_seq")).first()[0]
            published = published.where(F.col("stream_seq") != edge) if edge is not None else published
        missing = published.join(stream, "message_id", "left_anti")
        rows = missing.orderBy("stream_seq").collect()
        report.missing_from_stream[name] = [r.message_id for r in rows]
        missing_rows += rows
        cutoff = F.expr(f"current_timestamp() - INTERVAL {int(grace)} SECONDS")
        settled = stream.where(F.col("timestamp") < cutoff).where(F.col("message_id").isNotNull())
        for consumer in sorted(c.name for c in topology.consumers.values() if c.stream == name):
            seen = inbox.where(F.col("consumer") == consumer).select("message_id")
            report.unprocessed[consumer] = sorted(
                r.message_id for r in settled.join(seen, "message_id", "left_anti").collect())
        stream.unpersist()
    if repair and missing_rows:
        report.repaired = asyncio.run(_republish(nats, topology, missing_rows))
    return report


async def _republish(nats: NatsSettings, topology: Topology, rows) -> int:
    """Outbox rows missing from their stream, published again as the relay would have (`repair:{id}`)."""
    copies = (repair_copy(topology, _Published(r)) for r in rows)
    return await publish_copies(nats, copies, name="seamq-reconcile")


class _Published:
    """An outbox row as read by Spark, with an OutboxRow's fields (ids as UUIDs)."""

    def __init__(self, row) -> None:
        self.id = uuid.UUID(row.message_id)
        self.context, self.event_type, self.event_version, self.bucket = (row.context, row.event_type,
                                                                          row.event_version, row.bucket)
        self.payload, self.traceparent = row.payload, row.traceparent
        self.aggregate_type, self.aggregate_id, self.occurred_at = row.aggregate_type, row.aggregate_id, row.occurred_at
        self.correlation_id = uuid.UUID(row.correlation_id) if row.correlation_id else None
        self.causation_id = uuid.UUID(row.causation_id) if row.causation_id else None
        self.deliver_at = None  # long due by the time a repair runs


def report_text(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)
