"""The streaming event lake survives kill -9 of the whole Spark query: exactly N rows, no gaps, no doubles."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("pyspark")

from helpers import SEAMQ, spark_scratch  # noqa: E402
from seamq.settings import NatsSettings  # noqa: E402
from helpers import wait_for  # noqa: E402
from helpers.pipeline import publish  # noqa: E402


def committed_batches(checkpoint) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


@pytest.mark.timeout(900)  # its own limit: two Spark jobs of its own on a busy machine are no hang
async def test_lake_kill_9_and_restart_holds_exactly_n_rows(spark, nats_server, nc, provisioned, tmp_path,
                                                           service_env):
    lake = tmp_path / "lake"
    checkpoint = lake / "_checkpoints" / "VIBESPRO_EVENTS"
    events = await publish(nc, 3000)
    argv = [*SEAMQ, "pipeline", "lake", "--stream", "VIBESPRO_EVENTS", "--lake", str(lake), "--max-records", "250"]
    # Its own session, so kill -9 takes the Spark JVM and Python workers down with it; and its
    # scratch in our folder, since a killed JVM leaves it behind.
    scratch = tmp_path / "spark-scratch"
    scratch.mkdir()
    killed_env = {**service_env, "SEAMQ_PIPELINE__CONF": json.dumps(spark_scratch(scratch))}
    job = subprocess.Popen(argv, env=killed_env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_for(lambda: committed_batches(checkpoint) >= 3, timeout=300, what="three committed batches")
        events += await publish(nc, 2000, start=3000)  # more arrives while the query runs
        time.sleep(0.7)  # likely mid-batch
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert committed_batches(checkpoint) < 20  # it was killed before finishing (5000 / 250 = 20 batches)

    finish = subprocess.run([*argv, "--available-now"], env=service_env, capture_output=True, text=True,
                            timeout=300)
    assert finish.returncode == 0, finish.stderr[-2000:]
    rows = spark.read.parquet(str(lake)).select("message_id", "seq", "context", "event_type", "date").collect()
    assert len(rows) == 5000
    assert {r.message_id for r in rows} == {str(e.id) for e in events}
    assert sorted(r.seq for r in rows) == list(range(1, 5001))
    assert {(r.context, r.event_type) for r in rows} == {("vibespro", "vibe_created")}
    assert all(r.date is not None for r in rows)


async def test_replay_from_the_lake_restores_a_window_processed_once(spark, dsn, nats_server, nc, provisioned,
                                                                    tmp_path):
    from datetime import datetime, timedelta

    from seamq.pipeline.lake import keep_following, start_lake
    from seamq.pipeline.lake_replay import replay
    from seamq.registry import Registry
    from helpers.consumer import consuming

    events = await publish(nc, 400)
    lake = tmp_path / "lake"
    keep_following(lambda: start_lake(spark, nats=NatsSettings(url=nats_server.url), stream="VIBESPRO_EVENTS",
                                      lake=lake, checkpoint=tmp_path / "checkpoint", available_now=True),
                   lambda batch, rows: None)
    await nc.jetstream().purge_stream("VIBESPRO_EVENTS")  # the stream loses its history

    handled = []

    async def handler(envelope, tx):
        handled.append(envelope.message_id)

    now = datetime.utcnow()
    window = dict(nats=NatsSettings(url=nats_server.url), lake=lake, since=now - timedelta(hours=1), until=now + timedelta(hours=1))
    assert await asyncio.to_thread(replay, spark, **window) == 400
    async with consuming(dsn, nats_server.url, provisioned, registry=Registry(default=handler)):
        await wait_for(lambda: len(handled) == 400, what="replayed events handled")
        assert await asyncio.to_thread(replay, spark, **window) == 400  # again: JetStream stores them...
        await asyncio.sleep(2.0)
    assert sorted(map(str, handled)) == sorted(str(e.id) for e in events)  # ...the inbox handles each once
    nothing = await asyncio.to_thread(replay, spark, **{**window, "since": now + timedelta(hours=2),
                                                        "until": now + timedelta(hours=3)})
    assert nothing == 0
