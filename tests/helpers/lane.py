"""Helpers for the lane's tests over the in-memory ports (seamq.memory): a consumer spec, events,
and publishing into the in-memory deliveries. No services: the unit tier uses them."""

from __future__ import annotations

import json

from seamq.model import Event, message_headers
from seamq.topology import ConsumerSpec

from seamq.memory import MemoryDeliveries, MemoryDelivery

SPEC = ConsumerSpec(name="sea__from_vibespro", target="sea", source="vibespro", stream="VIBESPRO_EVENTS",
                    filter_subject="vibespro.event.>", ack_wait=120, max_deliver=3, max_ack_pending=50, partitions=0,
                    pinned_ttl=10, replicas=1)


def event(aggregate: str, n: int) -> Event:
    return Event(context="vibespro", aggregate_type="vibe", aggregate_id=aggregate, event_type="vibe_created",
                 payload={"n": n})


def publish(source: MemoryDeliveries, e: Event) -> MemoryDelivery:
    return source.publish(str(e.subject), message_headers(e), json.dumps(e.payload).encode())
