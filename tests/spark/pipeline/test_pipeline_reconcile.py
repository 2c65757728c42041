"""reconcile finds events a broker lost, and --repair brings them back, processed once."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pyspark")

from seamq.registry import Registry  # noqa: E402
from seamq.settings import NatsSettings  # noqa: E402

from helpers import scalar, wait_for  # noqa: E402
from helpers.consumer import consuming  # noqa: E402
from helpers.relay import events_for, relay_running, unpublished, write  # noqa: E402


async def test_reconcile_finds_deleted_messages_and_repair_processes_them_once(spark, dsn, nats_server, nc,
                                                                                provisioned):
    from seamq.pipeline.reconcile import reconcile

    handled = []

    async def handler(envelope, tx):
        handled.append(envelope.message_id)

    events = events_for(aggregates=10, per_aggregate=30, context="vibespro")  # consumed by sea__from_vibespro
    write(dsn, events)
    async with relay_running(dsn, nats_server.url, provisioned):
        await wait_for(lambda: unpublished(dsn) == 0, what="published")
    js = nc.jetstream()
    lost = [5, 77, 150, 299]  # the broker "loses" these acknowledged messages
    lost_ids = {(await js.get_msg("VIBESPRO_EVENTS", seq)).headers["Nats-Msg-Id"] for seq in lost}
    for seq in lost:
        await js.delete_msg("VIBESPRO_EVENTS", seq)

    async with consuming(dsn, nats_server.url, provisioned, registry=Registry(default=handler)):
        await wait_for(lambda: len(handled) == 300 - len(lost), what="the rest handled")
        report = await asyncio.to_thread(reconcile, spark, dsn=dsn, nats=NatsSettings(url=nats_server.url),
                                         topology=provisioned, grace=0)
        assert set(report.missing_from_stream["VIBESPRO_EVENTS"]) == lost_ids
        assert report.missing_from_stream["SEA_EVENTS"] == []
        assert report.unprocessed["sea__from_vibespro"] == []

        repaired = await asyncio.to_thread(reconcile, spark, dsn=dsn, nats=NatsSettings(url=nats_server.url),
                                           topology=provisioned, grace=0, repair=True)
        assert repaired.repaired == len(lost)
        await wait_for(lambda: len(handled) == 300, what="repaired events handled")
        await asyncio.sleep(1.0)
    assert len(handled) == len(set(handled)) == 300  # every event exactly once
    assert scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == 300
    after = await asyncio.to_thread(reconcile, spark, dsn=dsn, nats=NatsSettings(url=nats_server.url), topology=provisioned,
                                    grace=0)
    assert after.unprocessed["sea__from_vibespro"] == []



async def test_a_loss_in_a_bulk_catch_up_is_found_whatever_the_grace_and_only_the_edge_batch_is_spared(
        spark, dsn, nats_server, nc, provisioned):
    """Rows published within `grace` of the stream's first message were never judged: after 300 events
    relayed at once into a new stream, a message deleted from the middle was not reported, even with
    --grace 1. Judge every row while nothing has left the stream's front; once it has, spare only the
    one batch across the edge."""
    from seamq.pipeline.reconcile import reconcile

    write(dsn, events_for(aggregates=10, per_aggregate=30, context="vibespro"))
    async with relay_running(dsn, nats_server.url, provisioned):
        await wait_for(lambda: unpublished(dsn) == 0, what="published")
    js = nc.jetstream()
    middle = (await js.get_msg("VIBESPRO_EVENTS", 150)).headers["Nats-Msg-Id"]
    await js.delete_msg("VIBESPRO_EVENTS", 150)
    nats = NatsSettings(url=nats_server.url)
    for grace in (60, 1):
        report = await asyncio.to_thread(reconcile, spark, dsn=dsn, nats=nats, topology=provisioned, grace=grace)
        assert report.missing_from_stream["VIBESPRO_EVENTS"] == [middle], f"grace {grace}"

    # The front ages out in the middle of the first batch (all 300 rows hold its last sequence, 300):
    # those rows are spared, as gone by right may look like lost; a loss in the next batch is found.
    write(dsn, events_for(aggregates=10, per_aggregate=30, context="vibespro"))
    async with relay_running(dsn, nats_server.url, provisioned):
        await wait_for(lambda: unpublished(dsn) == 0, what="published")
    later = (await js.get_msg("VIBESPRO_EVENTS", 450)).headers["Nats-Msg-Id"]
    await js.delete_msg("VIBESPRO_EVENTS", 450)
    await js.purge_stream("VIBESPRO_EVENTS", seq=100)  # what limits would do: the front is gone
    # The relay sent the first 300 as one batch or a few: the one holding the lowest sequence from 100 on
    # straddles the edge, and is spared with the middle loss if that was in it.
    edge = scalar(dsn, "SELECT min(stream_seq) FROM outbox_events WHERE stream_seq >= 100")
    middle_seq = scalar(dsn, "SELECT stream_seq FROM outbox_events WHERE id = %s", (middle,))
    assert edge < 450 <= scalar(dsn, "SELECT max(stream_seq) FROM outbox_events")
    report = await asyncio.to_thread(reconcile, spark, dsn=dsn, nats=nats, topology=provisioned, grace=60)
    assert sorted(report.missing_from_stream["VIBESPRO_EVENTS"]) == sorted(
        [later] + ([middle] if middle_seq != edge else []))
