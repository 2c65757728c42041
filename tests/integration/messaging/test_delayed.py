"""Delayed delivery: outbox.add(..., deliver_at=) reaches the handler no earlier than deliver_at,
soon after it (the relay wakes for it, not on its poll), and never holds its aggregate back."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from seamq import outbox
from seamq.model import ErrorCode, Event, SeamqError
from seamq.registry import Registry, Route
from seamq.settings import NatsSettings, RelaySettings, Settings
from seamq.wiring import run_relay

from helpers import scalar, wait_for
from helpers.consumer import consuming, vibe

handled: dict[uuid.UUID, datetime] = {}


async def note(envelope, conn) -> None:
    handled.setdefault(envelope.message_id, datetime.now(timezone.utc))


def relay_settings(dsn, nats_url) -> Settings:
    # A 30 s poll: only the relay's wake-up for the due time can deliver within the test's bounds.
    return Settings(database_url=dsn, nats=NatsSettings(url=nats_url), relay=RelaySettings(poll_interval=30))


def write(dsn, events, deliver_at=None):
    with psycopg.connect(dsn) as conn:
        for event in events:
            outbox.add(conn, event, deliver_at=deliver_at)


async def test_delayed_events_arrive_when_due_and_do_not_hold_their_aggregate(dsn, nats_server, nc, topo):
    handled.clear()
    stop = asyncio.Event()
    relay = asyncio.create_task(run_relay(relay_settings(dsn, nats_server.url), topo, stop))
    registry = Registry(routes=(Route("vibe_created", 1, note),))
    try:
        async with consuming(dsn, nats_server.url, topo, registry):
            await asyncio.sleep(0.5)  # the relay is idle, asleep on its 30 s poll
            now = datetime.now(timezone.utc)
            delayed = [(vibe(f"v-{i}", i), now + timedelta(seconds=1 + i / 10)) for i in range(10)]
            reminder, shipped = vibe("v-0", 100), vibe("v-0", 101)  # one aggregate: delayed, then not
            overdue = vibe("v-9", 102)
            delayed += [(reminder, now + timedelta(seconds=2)), (overdue, now - timedelta(seconds=5))]  # past: no wait
            for event, due in delayed:
                write(dsn, [event], deliver_at=due)
            write(dsn, [shipped])
            assert scalar(dsn, "SELECT count(*) FROM outbox_events WHERE held") == 11
            await wait_for(lambda: set(handled) >= {e.id for e, _ in delayed} | {shipped.id}, timeout=30,
                           what="every event handled")
    finally:
        stop.set()
        await asyncio.wait_for(relay, 30)
    late = {e.id: (handled[e.id] - due).total_seconds() for e, due in delayed if e is not overdue}
    assert min(late.values()) >= 0, late  # never before deliver_at
    assert max(late.values()) < 5, late  # woken for it: the poll would have been 30 s
    assert handled[shipped.id] < handled[reminder.id]  # the delayed event did not hold its aggregate
    assert (handled[overdue.id] - now).total_seconds() < 5
    # The inbox keeps each event's deliver_at (NULL for one not delayed): the KPIs count latency from it
    assert scalar(dsn, "SELECT count(*) FROM inbox_messages i JOIN outbox_events o ON o.id = i.message_id "
                       "WHERE i.deliver_at IS NOT DISTINCT FROM o.deliver_at") == len(delayed) + 1
    assert scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE deliver_at IS NOT NULL") == len(delayed)


async def test_rows_that_fell_due_while_no_relay_ran_go_out_at_its_start(dsn, nats_server, nc, topo):
    handled.clear()
    event = vibe("v-1", 1)
    write(dsn, [event], deliver_at=datetime.now(timezone.utc) + timedelta(seconds=0.5))
    await asyncio.sleep(1.0)
    assert scalar(dsn, "SELECT held FROM outbox_events") is True  # nobody released it
    stop = asyncio.Event()
    relay = asyncio.create_task(run_relay(relay_settings(dsn, nats_server.url), topo, stop))
    try:
        async with consuming(dsn, nats_server.url, topo, Registry(routes=(Route("vibe_created", 1, note),))):
            await wait_for(lambda: event.id in handled, timeout=10, what="the due event handled")
    finally:
        stop.set()
        await asyncio.wait_for(relay, 30)


def test_deliver_at_must_name_its_zone(dsn):
    with psycopg.connect(dsn) as conn, pytest.raises(SeamqError) as exc:
        outbox.add(conn, vibe(), deliver_at=datetime(2030, 1, 1))
    assert exc.value.code == ErrorCode.INVALID_OUTBOX and "deliver_at" in exc.value.message
    with psycopg.connect(dsn) as conn:  # the Event field is the same thing
        outbox.add(conn, Event(context="sea", aggregate_type="a", aggregate_id="1", event_type="x", payload={},
                               deliver_at=datetime.now(timezone.utc) + timedelta(hours=1)))
    assert scalar(dsn, "SELECT held FROM outbox_events") is True
