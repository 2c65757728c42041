"""The JetStream data source for Spark, in real Spark local mode against a real nats-server."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark", reason="the pipeline extra is part of make test's install")

from helpers.pipeline import publish  # noqa: E402


def read(spark, url: str, stream: str, **options):
    reader = spark.read.format("jetstream").option("url", url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


async def consumers_left(nc, stream: str) -> list[str]:
    return sorted(i.name for i in await nc.jetstream().consumers_info(stream))


async def test_batch_read_of_50k_returns_exactly_those_messages(spark, nats_server, nc, provisioned):
    events = await publish(nc, 50_000)
    df = read(spark, nats_server.url, "VIBESPRO_EVENTS", numPartitions=4)
    rows = df.select("seq", "message_id", "context", "event_type", "event_version", "payload").collect()
    assert len(rows) == 50_000
    assert {r.message_id for r in rows} == {str(e.id) for e in events}
    assert sorted(r.seq for r in rows) == list(range(1, 50_001))
    first = min(rows, key=lambda r: r.seq)
    assert (first.context, first.event_type, first.event_version) == ("vibespro", "vibe_created", 1)
    assert json.loads(first.payload) == {"n": 0}
    assert await consumers_left(nc, "VIBESPRO_EVENTS") == ["sea__from_vibespro"]  # ours are gone


async def test_gaps_and_empty_streams_do_not_hang(spark, nats_server, nc, provisioned):
    assert read(spark, nats_server.url, "SEA_EVENTS").count() == 0  # empty stream
    await publish(nc, 300, context="sea")
    js = nc.jetstream()
    for seq in (1, 150, 151, 300):  # the first, a run in the middle, and the last
        await js.delete_msg("SEA_EVENTS", seq)
    rows = read(spark, nats_server.url, "SEA_EVENTS", numPartitions=3).select("seq").collect()
    assert sorted(r.seq for r in rows) == [s for s in range(1, 301) if s not in (1, 150, 151, 300)]


async def test_streaming_read_with_admission_control_and_available_now(spark, nats_server, nc, provisioned,
                                                                        tmp_path):
    await publish(nc, 2_500)
    df = (spark.readStream.format("jetstream").option("url", nats_server.url).option("stream", "VIBESPRO_EVENTS")
          .option("maxRecordsPerBatch", "1000").load())
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_available_now():
        query = (df.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        return query

    query = run_available_now()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [1000, 1000, 500]  # admission control: at most maxRecordsPerBatch per micro-batch
    await publish(nc, 700, start=2_500)
    run_available_now()  # restarts from the checkpoint: only the new messages
    rows = spark.read.parquet(str(out)).select("seq").collect()
    assert sorted(r.seq for r in rows) == list(range(1, 3_201))


async def test_the_source_and_the_drivers_connect_with_the_settings_credentials(spark, tmp_path):
    """On any cluster the executors connect as the workers do: with the user, password, TLS of the
    settings (before, the pipeline dialled the bare URL and failed on a server that wants them)."""
    import nats

    from seamq.embedded import NatsServer
    from seamq.nats.provision import apply
    from seamq.pipeline.reconcile import _first_seq
    from seamq.pipeline.source import source_options
    from seamq.settings import NatsSettings
    from seamq.topology import load_topology

    server = NatsServer(tmp_path / "nats", user="spark", password="s3cret-pw")
    server.start()
    try:
        nc = await nats.connect(server.url, user="spark", password="s3cret-pw")
        await apply(nc.jetstream(), load_topology())
        await publish(nc, 40)
        await nc.close()
        settings = NatsSettings(url=server.url, user="spark", password="s3cret-pw")
        options = source_options(settings)
        assert options == {"url": server.url, "user": "spark", "password": "s3cret-pw"}
        df = spark.read.format("jetstream").options(**options).option("stream", "VIBESPRO_EVENTS").load()
        assert df.count() == 40
        assert await _first_seq(settings, "VIBESPRO_EVENTS") == 1
        with pytest.raises(Exception, match="no servers available"):  # after "Authorization Violation"
            read(spark, server.url, "VIBESPRO_EVENTS").count()  # no credentials: refused, not a silent empty read
    finally:
        server.kill()


def test_python_workers_import_the_compiled_pyspark(spark):
    """Not pyspark.zip, which Python compiles again in each worker: three times the CPU per start,
    and Spark gives a starting worker 10 s to connect back (a busy machine missed it)."""
    def where(_):
        import pyspark
        return pyspark.__file__

    [path] = spark.sparkContext.parallelize([0], 1).map(where).collect()
    assert ".zip" not in path and path.endswith("pyspark/__init__.py"), path
