"""Reconcile the outbox, the streams and the inboxes; repair what a broker lost.

Anti-joins in Spark:
- published in the outbox but missing from its stream (broker-side loss:
  JetStream's default lazy fsync can lose acknowledged writes), leaving out
  rows whose stream sequence is below the stream's first (aged out by limits).
  A row published in a fast batch holds its batch's last sequence ("stored
  at or before"), so a batch that straddles the stream's first message could
  look missing when it aged out: rows published within `grace` of the first
  message's time are not judged;
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
from datetime import datetime, timezone

from pyspark.sql import SparkSession

from seamq.model import Header, message_headers
from seamq.nats import jsapi
from seamq.nats.connect import connect
from seamq.nats.publisher import publish_copies
from seamq.pipeline.source import source_options
from seamq.pipeline import pg_source
from seamq.republish import Copy
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


async def _first(nats: NatsSettings, stream: str) -> tuple[int, int]:
    """The stream's first sequence and its time in microseconds (nats-py's StreamState has no first_ts)."""
    nc = await connect(nats, name="seamq-reconcile", persistent=False)
    try:
        state = (await jsapi.call(nc, f"STREAM.INFO.{stream}") or {}).get("state", {})
    finally:
        await nc.close()
    return state.get("first_seq", 0), _micros(state.get("first_ts") or "1970-01-01T00:00:00Z")


def _micros(rfc3339: str) -> int:
    """nats-server's times have nanoseconds, which fromisoformat does not take."""
    whole, _, fraction = rfc3339.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return int(seconds) * 1_000_000 + int((fraction + "000000")[:6])


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
        first_seq, first_ts = asyncio.run(_first(nats, name))
        near_edge = F.abs(F.unix_micros("published_at") - F.lit(first_ts)) <= int(grace * 1_000_000)
        published = outbox.where((F.col("context") == context) & (F.col("stream_seq") >= first_seq)
                                 & ~near_edge)
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
    copies = (Copy(topology.event_subject(r.context, r.event_type, r.event_version, r.bucket),
                   message_headers(_Published(r), r.traceparent), r.payload.encode(), r.message_id,
                   msg_id=f"repair:{r.message_id}") for r in rows)
    return await publish_copies(nats, copies, name="seamq-reconcile")


class _Published:
    """An outbox row as read by Spark, with the fields message_headers reads (ids as UUIDs)."""

    def __init__(self, row) -> None:
        self.id = uuid.UUID(row.message_id)
        self.aggregate_type, self.aggregate_id, self.occurred_at = row.aggregate_type, row.aggregate_id, row.occurred_at
        self.correlation_id = uuid.UUID(row.correlation_id) if row.correlation_id else None
        self.causation_id = uuid.UUID(row.causation_id) if row.causation_id else None
        self.deliver_at = None  # long due by the time a repair runs


def report_text(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)
