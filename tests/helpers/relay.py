"""Helpers for tests of the relay: events that interleave aggregates, outbox writes, a relay running
in the test's loop, and the exactly-once-in-order check of a stream."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from contextlib import asynccontextmanager

import psycopg

from seamq import outbox
from seamq.model import Event
from seamq.settings import NatsSettings, RelaySettings, Settings
from seamq.wiring import run_relay

from helpers import scalar

def events_for(aggregates: int, per_aggregate: int, context: str = "sea") -> list[Event]:
    """Interleaved: event n of every aggregate, then n+1, so claims race across aggregates."""
    return [
        Event(context=context, aggregate_type="order", aggregate_id=f"o-{a}", event_type="order_updated",
              payload={"aggregate": a, "n": n})
        for n in range(per_aggregate) for a in range(aggregates)
    ]


def write(dsn: str, events: list[Event], per_tx: int = 1000) -> None:
    with psycopg.connect(dsn) as conn:
        for i in range(0, len(events), per_tx):
            with conn.transaction():
                outbox.add_many(conn, events[i:i + per_tx])


def unpublished(dsn: str) -> int:
    return scalar(dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL")


def settings_for(dsn: str, nats_url: str, **relay) -> Settings:
    return Settings(database_url=dsn, nats=NatsSettings(url=nats_url), relay=RelaySettings(**relay))


@asynccontextmanager
async def relay_running(dsn, nats_url, topology, **relay):
    stop = asyncio.Event()
    task = asyncio.create_task(run_relay(settings_for(dsn, nats_url, **relay), topology, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def check_exactly_once_in_order(messages, expected: list[Event]) -> None:
    ids = [m.headers["Nats-Msg-Id"] for m in messages]
    assert len(ids) == len(set(ids)), "a message is in the stream twice"
    stored, written = set(ids), {str(e.id) for e in expected}
    assert stored == written, (f"stream and outbox differ: {len(written - stored)} of {len(written)} events missing "
                               f"from the stream (e.g. {sorted(written - stored)[:3]}), {len(stored - written)} "
                               f"in it that no outbox wrote")
    seen = defaultdict(list)
    for m in messages:
        body = json.loads(m.data)
        seen[body["aggregate"]].append(body["n"])
    for aggregate, ns in seen.items():
        assert ns == sorted(ns), f"aggregate {aggregate} out of order: {ns[:20]}"
