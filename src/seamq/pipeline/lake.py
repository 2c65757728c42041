"""The event lake: a JetStream stream -> Parquet, partitioned by context / event_type / date.

A Spark structured-streaming query with a checkpoint: the checkpoint holds
the last stream sequence of each committed micro-batch, and Spark's file
sink writes a batch's files and commits them in its `_spark_metadata` log in
one step. So a query killed at any point (kill -9 included) and started
again neither loses nor repeats a message. Read the lake through Spark
(`spark.read.parquet(path)`), which honours that log; a raw file listing can
see files of a batch that never committed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from seamq.backoff import NO_JITTER, Backoff
from seamq.model import ErrorCode, SeamqError
from seamq.observability import log
from seamq.pipeline.source import source_options
from seamq.settings import NatsSettings

RESTART_WAIT = Backoff(base=2.0, cap=60.0, spread=NO_JITTER)  # by the failures in a row
RESTARTS = 3  # failures in a row, with no batch committed between them, before the command gives up


def start_lake(spark: SparkSession, *, nats: NatsSettings, stream: str, lake: Path, checkpoint: Path,
               max_records: int = 50_000, available_now: bool = False, every: str = "2 seconds"):
    """Start the streaming query; returns it running."""
    source = (spark.readStream.format("jetstream").options(**source_options(nats)).option("stream", stream)
              .option("maxRecordsPerBatch", str(max_records)).load())
    events = source.withColumn("date", F.to_date("timestamp")).withColumn(
        "event_type", F.coalesce("event_type", F.lit("_invalid")))
    writer = (events.writeStream.format("parquet").option("path", str(lake))
              .option("checkpointLocation", str(checkpoint))
              .partitionBy("context", "event_type", "date").queryName(f"lake_{stream}"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=every)
    return writer.start()


def follow(query, report: Callable[[int, int], None], stop: Callable[[], bool] = lambda: False) -> None:
    """Wait for the query, reporting (batch id, rows) per micro-batch; raise what failed it."""
    seen = -1

    def new_batches() -> None:
        nonlocal seen
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                report(seen, progress["numInputRows"])

    while query.isActive and not stop():
        new_batches()
        time.sleep(0.5)
    if query.isActive:
        query.stop()
    new_batches()  # the last ones, committed after the last look
    if query.exception() is not None:  # a failed streaming query shows only here
        raise RuntimeError(f"lake query failed: {query.exception()}")


def keep_following(start: Callable[[], object], report: Callable[[int, int], None],
                   stop: Callable[[], bool] = lambda: False, *, restarts: int = RESTARTS,
                   pause: Callable[[float], None] = time.sleep) -> None:
    """Follow the query `start` starts; one that fails is started again from its checkpoint, which
    keeps the lake exactly once, after a pause that doubles: a Spark Python worker that misses its
    10 s to connect back on a busy machine must not end a long-running lake. Each failure is logged
    with its reason; `restarts` failures in a row without a batch committed raise the last."""
    failures = 0
    while True:
        committed = []

        def counted(batch: int, rows: int) -> None:
            committed.append(batch)  # noqa: B023  # called within this round only
            report(batch, rows)

        try:
            follow(start(), counted, stop)
            return
        except RuntimeError as exc:
            failures = 1 if committed else failures + 1
            reason = str(exc).splitlines()[0]
            if failures > restarts:
                raise SeamqError(ErrorCode.PIPELINE_FAILED, f"{reason} ({failures} failures in a row, none of "
                                 "them after a committed batch; the checkpoint is intact: run it again)") from exc
            log.warning("lake_query_restarting", reason=reason, failure=failures, of=restarts)
            pause(RESTART_WAIT.delay(failures))
