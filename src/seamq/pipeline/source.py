"""A JetStream data source for Spark (PySpark's Python Data Source API).

    spark.dataSource.register(JetStreamDataSource)
    df = (spark.read.format("jetstream")
          .option("url", "nats://127.0.0.1:4222").option("stream", "SEA_EVENTS").load())

Offsets are stream sequence numbers. A partition is a range of sequences,
read by a short-lived pull consumer (no acks, start at the range's first
sequence) that is deleted afterwards, so no consumer is left behind on the
stream. Gaps (deleted or filtered-out messages) are skipped; the read of a
range stops at its last sequence or at the end of the stream, so it never
waits for messages that will not come. Rows go to Spark as Arrow batches.

Options: stream (required), subject (filter, default the stream's subjects),
numPartitions (default 2), maxRecordsPerBatch (streaming admission control),
startingSeq (streaming: first sequence to read; default the stream's first),
and the connection: url, user, password, token, credsFile, nkeySeedFile,
tlsCa, tlsCert, tlsKey, which `source_options(settings.nats)` fills from
seamq's settings. Every executor connects through seamq.nats.connect, so
credentials and TLS apply on any cluster exactly as in the workers (Spark
redacts options named like password and token in plans and its UI; the
files must exist on the executors).

This module is imported by Spark's Python workers, so it stays light: nats-py,
pyarrow, seamq's connect and pull helpers (16 MB and about 0.1 s per Python
worker, measured, for the settings model the connect path shares).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from seamq.model import EventSubject, Header, SeamqError

SCHEMA = (
    "seq long, subject string, context string, event_type string, event_version int, message_id string, "
    "headers map<string,string>, payload string, timestamp timestamp"
)
ARROW_BATCH = 5000
FETCH = 1000


class SeqRange(InputPartition):
    """(first, last) sequence, both included; kept in `value`, which Spark always carries."""

    def __init__(self, first: int, last: int) -> None:
        super().__init__((first, last))


def _split(first: int, last: int, parts: int) -> list[SeqRange]:
    """[first, last] in up to `parts` contiguous ranges; none when empty."""
    if last < first:
        return []
    parts = max(1, min(parts, last - first + 1))
    size = -(-(last - first + 1) // parts)
    return [SeqRange(lo, min(last, lo + size - 1)) for lo in range(first, last + 1, size)]


class _Options:
    def __init__(self, options: dict) -> None:
        self.url = options.get("url", "nats://127.0.0.1:4222")
        self.stream = options.get("stream")
        if not self.stream:
            raise ValueError("jetstream source: option 'stream' is required")
        self.subject = options.get("subject")
        self.partitions = int(options.get("numPartitions", 2))
        self.max_records = int(options["maxRecordsPerBatch"]) if options.get("maxRecordsPerBatch") else None
        self.starting_seq = int(options["startingSeq"]) if options.get("startingSeq") else None
        from seamq.settings import NatsSettings

        self.nats = NatsSettings(url=self.url, **{field: options[option] for field, option in _CONNECTION.items()
                                                  if option != "url" and options.get(option)})

    async def connect(self):
        from seamq.nats.connect import connect

        return await connect(self.nats, name="seamq-spark", persistent=False)


# NatsSettings field -> data source option
_CONNECTION = {"url": "url", "user": "user", "password": "password", "token": "token", "creds_file": "credsFile",
               "nkey_seed_file": "nkeySeedFile", "tls_ca": "tlsCa", "tls_cert": "tlsCert", "tls_key": "tlsKey"}


def source_options(nats) -> dict[str, str]:
    """The data source's connection options for `NatsSettings`: what the workers use, on every executor."""
    secret = lambda v: v.get_secret_value() if hasattr(v, "get_secret_value") else v  # noqa: E731
    return {option: str(secret(getattr(nats, field))) for field, option in _CONNECTION.items()
            if getattr(nats, field) is not None}


def _run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def _bounds(options: _Options) -> tuple[int, int]:
    """(first, last) sequence of the stream now; last < first when empty."""
    nc = await options.connect()
    try:
        state = (await nc.jetstream().stream_info(options.stream)).state
        if not state.messages:  # an empty stream reports first = last = 0, or first = last + 1
            return state.last_seq + 1, state.last_seq
        return state.first_seq, state.last_seq
    finally:
        await nc.close()


def _read_range(options: _Options, first: int, last: int) -> Iterator:
    """Arrow record batches of the messages with first <= seq <= last."""
    import pyarrow as pa

    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from seamq.nats.pull import PullSource

    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    nc = run(options.connect())
    js = nc.jetstream()
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first,
        # Deleted when the read ends; if Spark abandons the read early (a LIMIT),
        # JetStream removes it after 10 s of inactivity.
        inactive_threshold=10, mem_storage=True,
        **({"filter_subject": options.subject} if options.subject else {}),
    )
    consumer = run(js.add_consumer(options.stream, config)).name
    source = run(PullSource(nc, options.stream, consumer, buffer=2 * FETCH).start())
    try:
        rows: list[tuple] = []
        done = False
        while not done:
            msgs = run(source.fetch(FETCH, 2.0))
            if not msgs:  # nothing within the timeout: the range (or the stream) is exhausted
                break
            for msg in msgs:
                meta = msg.metadata
                seq = meta.sequence.stream
                if seq > last:
                    done = True
                    break
                rows.append(_row(msg, seq, meta.timestamp))
                if seq >= last or meta.num_pending == 0:
                    done = True
                    break
            if len(rows) >= ARROW_BATCH or (done and rows):
                yield _batch(pa, rows)
                rows = []
        if rows:
            yield _batch(pa, rows)
    finally:
        try:
            run(js.delete_consumer(options.stream, consumer))
        except Exception:
            pass  # inactive_threshold removes it anyway
        source.stop_requesting()
        run(nc.close())
        loop.close()


def _row(msg, seq: int, timestamp) -> tuple:
    headers = dict(msg.headers or {})
    try:
        event = EventSubject.parse(msg.subject)  # with or without a partition bucket
    except SeamqError:
        event = None
    stamp = timestamp if isinstance(timestamp, datetime) else None
    return (
        seq, msg.subject, event.context if event else msg.subject.split(".", 1)[0],
        event.name if event else None, event.version if event else None,
        headers.get(Header.REPLAY_MESSAGE_ID) or headers.get(Header.MSG_ID), list(headers.items()),
        msg.data.decode("utf-8", errors="replace"), stamp.astimezone(timezone.utc) if stamp else None,
    )


_ARROW_SCHEMA = None


def _batch(pa, rows: list[tuple]):
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        _ARROW_SCHEMA = pa.schema([
            ("seq", pa.int64()), ("subject", pa.string()), ("context", pa.string()), ("event_type", pa.string()),
            ("event_version", pa.int32()), ("message_id", pa.string()),
            ("headers", pa.map_(pa.string(), pa.string())), ("payload", pa.string()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ])
    columns = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, _ARROW_SCHEMA)], schema=_ARROW_SCHEMA)


def _read_partition(options: _Options, partition: InputPartition) -> Iterator:
    # With no partitions (an empty range) Spark still calls read() once, with value None.
    if partition.value is None:
        return iter(())
    first, last = partition.value
    return _read_range(options, first, last)


class JetStreamBatchReader(DataSourceReader):
    def __init__(self, options: _Options) -> None:
        self.options = options

    def partitions(self):
        first, last = _run(_bounds(self.options))
        return _split(first, last, self.options.partitions)

    def read(self, partition: SeqRange):
        return _read_partition(self.options, partition)


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: {"seq": last sequence included}; a micro-batch is (start, end]."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self._available_now: int | None = None

    def initialOffset(self) -> dict:
        first, _ = _run(_bounds(self.options))
        start = self.options.starting_seq or first
        return {"seq": max(0, start - 1)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_records) if self.options.max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        _, last = _run(_bounds(self.options))
        self._available_now = last  # read up to what exists now, then stop

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        _, last = _run(_bounds(self.options))
        if self._available_now is not None:
            last = min(last, self._available_now)
        end = max(start["seq"], last)
        if isinstance(limit, ReadMaxRows):
            # Sequence numbers are at least as many as rows, so this never exceeds the limit.
            end = min(end, start["seq"] + limit.max_rows)
        return {"seq": end}

    def partitions(self, start: dict, end: dict):
        return _split(start["seq"] + 1, end["seq"], self.options.partitions)

    def read(self, partition: SeqRange):
        return _read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        pass  # JetStream keeps the messages; nothing to release


class JetStreamDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return JetStreamBatchReader(_Options(self.options))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return JetStreamStreamReader(_Options(self.options))

