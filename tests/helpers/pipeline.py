"""Helpers for the pipeline's tests: a synthetic outbox and inbox with known KPIs, and events
published straight into a stream."""

from __future__ import annotations

import json

import psycopg

from seamq.model import Event, message_headers
from seamq.nats.publisher import PipelinedPublisher
from seamq.ports import OutMessage

HOUR = "2026-11-20 10:00:00+00"


def seed(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        # sea.order_placed: 10,000 events, 9,990 published, relay lag (i % 100) ms.
        conn.execute(f"""
            INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload,
                                       occurred_at, created_at, published_at)
            SELECT gen_random_uuid(), 'sea', 'order', 'o', 'order_placed', '{{}}',
                   t, t, CASE WHEN i <= 9990 THEN t + (i % 100) * interval '1 millisecond' END
            FROM generate_series(1, 10000) AS i, LATERAL (SELECT '{HOUR}'::timestamptz
                                                          + (i % 3600) * interval '1 second' AS t) x""")
        # Its consumer: 1,000 rows, 995 processed after i ms, 5 dead-lettered, 10 with a duplicate.
        conn.execute(f"""
            INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, status,
                                        occurred_at, received_at, processed_at, duplicates)
            SELECT 'vibespro__from_sea', gen_random_uuid(), 'sea.event.order_placed.v1', 'order_placed', 1,
                   CASE WHEN i <= 995 THEN 'processed' ELSE 'dead_lettered' END, t, t,
                   CASE WHEN i <= 995 THEN t + i * interval '1 millisecond' END, CASE WHEN i <= 10 THEN 1 ELSE 0 END
            FROM generate_series(1, 1000) AS i, LATERAL (SELECT '{HOUR}'::timestamptz
                                                         + (i % 3600) * interval '1 second' AS t) x""")
        # vibespro.vibe_created: healthy. Every other event was delayed by an hour (deliver_at), then
        # published 2 ms and handled 10 ms after it fell due, like the others after they occurred.
        due = "CASE WHEN i % 2 = 0 THEN t + interval '1 hour' END"
        conn.execute(f"""
            INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload,
                                       occurred_at, created_at, deliver_at, published_at)
            SELECT gen_random_uuid(), 'vibespro', 'vibe', 'v', 'vibe_created', '{{}}', t, t, {due},
                   coalesce({due}, t) + interval '2 milliseconds'
            FROM generate_series(1, 100) AS i, LATERAL (SELECT '{HOUR}'::timestamptz + i * interval '1 second' AS t) x""")
        conn.execute(f"""
            INSERT INTO inbox_messages (consumer, message_id, subject, event_type, event_version, status,
                                        occurred_at, deliver_at, received_at, processed_at)
            SELECT 'sea__from_vibespro', gen_random_uuid(), 'vibespro.event.vibe_created.v1', 'vibe_created', 1,
                   'processed', t, {due}, t, coalesce({due}, t) + interval '10 milliseconds'
            FROM generate_series(1, 100) AS i, LATERAL (SELECT '{HOUR}'::timestamptz + i * interval '1 second' AS t) x""")


async def publish(nc, count: int, context: str = "vibespro", start: int = 0) -> list[Event]:
    publisher = await PipelinedPublisher(nc, timeout=30).start()
    events = [Event(context=context, aggregate_type="vibe", aggregate_id=f"v-{n % 100}", event_type="vibe_created",
                    payload={"n": n}) for n in range(start, start + count)]
    for i in range(0, count, 5000):
        chunk = events[i:i + 5000]
        results = await publisher.publish_many([
            OutMessage(str(e.subject), json.dumps(e.payload).encode(), message_headers(e)) for e in chunk])
        assert all(r.ok for r in results)
    await publisher.close()
    return events
