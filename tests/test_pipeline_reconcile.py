"""reconcile finds events a broker lost, and --repair brings them back, processed once."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pyspark")

from seamq.registry import Registry  # noqa: E402
from seamq.settings import NatsSettings  # noqa: E402

from helpers import scalar, wait_for  # noqa: E402
from test_consumer import consuming  # noqa: E402
from test_relay import events_for, relay_running, unpublished, write  # noqa: E402


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

