"""A PostgreSQL data source for Spark: seamq's outbox and inbox rows, read by the
executors in parallel ranges of time, never through the driver.

    spark.read.format("seamq_pg").options(**pg_options(dsn)).option("read", "outbox_kpis")
         .option("since", "2026-11-20T10:00:00+00:00").option("until", "2026-11-20T11:00:00+00:00").load()

A read is one of the named queries below, over a window of `occurred_at`
(since included, until excluded; without them, from the first row to the
last). The driver only splits the window into `numPartitions` time ranges;
each executor opens its own connection and streams its range through a
server-side cursor into Arrow batches, so neither the driver's nor an
executor's memory grows with the table. Migration 0003's BRIN indexes let
PostgreSQL read only the block ranges of a time range.

The password travels to the executors as the option `password`, which Spark
redacts in plans and its UI; the rest of the connection string as `conninfo`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Iterator, NamedTuple

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

class Read(NamedTuple):
    schema: str  # Spark's
    table: str
    select: str  # columns, in the schema's order
    where: str  # the window is added to it

    @property
    def sql(self) -> str:
        return f"SELECT {self.select} FROM {self.table} WHERE {self.where}"


READS = {
    # `due_at`: when the event was to go out (a delayed one: its deliver_at); lag and latency count from it.
    "outbox_kpis": Read(
        "context string, event_type string, occurred_at timestamp, due_at timestamp, published_at timestamp",
        "outbox_events", "context, event_type, occurred_at, greatest(created_at, deliver_at), published_at", "true"),
    "inbox_kpis": Read(
        "consumer string, event_type string, status string, duplicates int, occurred_at timestamp, "
        "due_at timestamp, processed_at timestamp",
        "inbox_messages", "consumer, event_type, status, duplicates, occurred_at, greatest(occurred_at, deliver_at), "
        "processed_at", "occurred_at IS NOT NULL"),
    "outbox_published": Read(
        "message_id string, context string, aggregate_type string, aggregate_id string, event_type string, "
        "event_version int, payload string, occurred_at timestamp, correlation_id string, causation_id string, "
        "traceparent string, stream_seq long, published_at timestamp, bucket int",
        "outbox_events", "id::text, context, aggregate_type, aggregate_id, event_type, event_version, payload::text, "
        "occurred_at, correlation_id::text, causation_id::text, traceparent, stream_seq, published_at, bucket",
        "published_at IS NOT NULL"),
    "inbox_settled": Read(
        "consumer string, message_id string, status string, occurred_at timestamp",
        "inbox_messages", "consumer, message_id::text, status, occurred_at",
        "status IN ('processed', 'dead_lettered', 'exhausted')"),
}
ARROW_BATCH = 10_000


def pg_options(dsn: str) -> dict[str, str]:
    """The connection as data source options: the password apart, where Spark redacts it."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)
    return {"conninfo": make_conninfo(**params), **({"password": str(password)} if password else {})}


def read(spark, dsn: str, name: str, since: datetime | None = None, until: datetime | None = None,
         partitions: int | None = None):
    """The DataFrame of one named read over a window."""
    reader = (spark.read.format("seamq_pg").options(**pg_options(dsn)).option("read", name)
              .option("numPartitions", str(partitions or spark.sparkContext.defaultParallelism)))
    if since:
        reader = reader.option("since", since.isoformat())
    if until:
        reader = reader.option("until", until.isoformat())
    return reader.load()


class TimeRange(InputPartition):
    """[lo, hi) as ISO strings, in `value`, which Spark always carries to the executor."""

    def __init__(self, lo: datetime, hi: datetime) -> None:
        super().__init__((lo.isoformat(), hi.isoformat()))


def split(lo: datetime, hi: datetime, parts: int) -> list[TimeRange]:
    """[lo, hi) in up to `parts` contiguous ranges of equal length, whole microseconds; none when empty."""
    span = (hi - lo) // timedelta(microseconds=1)
    if span <= 0:
        return []
    parts = max(1, min(parts, span))
    bounds = [lo + timedelta(microseconds=span * k // parts) for k in range(parts)] + [hi]
    return [TimeRange(a, b) for a, b in zip(bounds, bounds[1:])]


class _Options:
    def __init__(self, options: dict) -> None:
        self.name = options.get("read")
        if self.name not in READS:
            raise ValueError(f"seamq_pg source: option 'read' must be one of {sorted(READS)}, not {self.name!r}")
        self.conninfo = options.get("conninfo", "")
        self.password = options.get("password")
        self.partitions = int(options.get("numPartitions", 2))
        self.since = _instant(options.get("since"))
        self.until = _instant(options.get("until"))

    def connect(self):
        import psycopg

        return psycopg.connect(self.conninfo, **({"password": self.password} if self.password else {}))


def _instant(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


class PgReader(DataSourceReader):
    def __init__(self, options: _Options) -> None:
        self.options = options

    def partitions(self):
        lo, hi = self.options.since, self.options.until
        if lo is None or hi is None:  # the table's own bounds: one aggregate query, on the driver
            with self.options.connect() as conn:
                first, last = conn.execute(
                    f"SELECT min(occurred_at), max(occurred_at) FROM {READS[self.options.name].table}").fetchone()
            if first is None:
                return []
            lo, hi = lo or first, hi or last + timedelta(microseconds=1)
        return split(lo, hi, self.options.partitions)

    def read(self, partition: TimeRange) -> Iterator:
        if partition.value is None:  # no partitions (an empty window): Spark still calls read() once
            return iter(())
        return _read_range(self.options, *partition.value)


def _read_range(options: _Options, lo: str, hi: str) -> Iterator:
    import pyarrow as pa

    read = READS[options.name]
    arrow = pa.schema([_arrow_field(pa, column) for column in read.schema.split(", ")])
    with options.connect() as conn, conn.cursor(name="seamq_spark_read") as cur:
        cur.itersize = ARROW_BATCH
        cur.execute(f"{read.sql} AND occurred_at >= %s AND occurred_at < %s", (lo, hi))
        while rows := cur.fetchmany(ARROW_BATCH):
            columns = list(zip(*rows))
            yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, arrow)],
                                             schema=arrow)


def _arrow_field(pa, column: str):
    name, kind = column.split(" ")
    types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(),
             "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.field(name, types[kind])


class PgDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "seamq_pg"

    def schema(self) -> str:
        return READS[_Options(self.options).name].schema

    def reader(self, schema) -> DataSourceReader:
        return PgReader(_Options(self.options))
