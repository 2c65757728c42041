"""Helpers for tests of the consumer against real services: events, publishing, a consumer running
in the test's loop, and what its inbox and JetStream say."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import psycopg

from seamq.model import Event, message_headers, traceparent_for
from seamq.settings import ConsumerSettings, NatsSettings, Settings
from seamq.typed import payload_json
from seamq.wiring import run_consumer

CONSUMER = "sea__from_vibespro"


def vibe(aggregate: str = "v-1", n: int = 0, event_type: str = "vibe_created", version: int = 1, **kw) -> Event:
    return Event(context="vibespro", aggregate_type="vibe", aggregate_id=aggregate, event_type=event_type,
                 event_version=version, payload={"n": n, **kw})


async def publish(js, events: list[Event], msg_id: str | None = None) -> None:
    for e in events:
        headers = message_headers(e, traceparent_for(e.id))
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        await js.publish(str(e.subject), json.dumps(payload_json(e)).encode(), headers=headers)


def settings(dsn, nats_url, **consumer) -> Settings:
    consumer.setdefault("nak_base", 0.1)
    consumer.setdefault("nak_max", 0.5)
    consumer.setdefault("handler_secret", "test-secret")
    return Settings(database_url=dsn, nats=NatsSettings(url=nats_url), consumer=ConsumerSettings(**consumer))


@asynccontextmanager
async def consuming(dsn, nats_url, topology, registry=None, **consumer):
    stop = asyncio.Event()
    task = asyncio.create_task(run_consumer(settings(dsn, nats_url, **consumer), topology, CONSUMER, stop, registry))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def attempts(dsn, message_id) -> list[tuple[int, str]]:
    """A message's failed attempts, from its history: (attempt, error)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT attempt, error FROM inbox_attempts WHERE message_id = %s ORDER BY failed_at",
                            (message_id,)).fetchall()


def inbox(dsn, message_id) -> dict:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute("SELECT * FROM inbox_messages WHERE message_id = %s", (message_id,))
        row = cur.fetchone()
        return dict(zip([c.name for c in cur.description], row)) if row else {}


async def _pulls(js, count: int) -> bool:
    return (await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)).num_waiting >= count


async def settled(js) -> bool:
    info = await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)
    return info.num_pending == 0 and info.num_ack_pending == 0
