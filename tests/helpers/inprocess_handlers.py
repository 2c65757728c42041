"""In-process handlers for consumer tests run in a subprocess (importable via PYTHONPATH)."""

import asyncio
import os

from seamq import Poison
from seamq.registry import Registry


async def count_side_effect(envelope, tx) -> None:
    """Writes its side effect in the inbox transaction; no unique key, so doubles would show."""
    await tx.execute("INSERT INTO side_effects (message_id, aggregate_id) VALUES (%s, %s)",
                     (envelope.message_id, envelope.aggregate_id))
    await asyncio.sleep(float(os.environ.get("HANDLER_SLEEP", "0")))


REGISTRY = Registry(default="helpers.inprocess_handlers:count_side_effect")


async def record_v1(envelope, tx) -> None:
    await tx.execute("INSERT INTO handled (message_id, version, handler) VALUES (%s, %s, 'v1')",
                     (envelope.message_id, envelope.event_version))


async def record_v2(envelope, tx) -> None:
    await tx.execute("INSERT INTO handled (message_id, version, handler) VALUES (%s, %s, 'v2')",
                     (envelope.message_id, envelope.event_version))


async def record_order(envelope, tx) -> None:
    """Records each aggregate's messages in the order they were handled (a serial id, and this
    process); about 1% fail their first delivery (a transient error: retried, must keep its place)."""
    n = envelope.payload["n"]
    if envelope.delivery_attempt == 1 and (n * 7 + int(envelope.aggregate_id[2:])) % 100 == 0:
        raise RuntimeError("transient failure")
    await tx.execute("INSERT INTO handled_order (message_id, aggregate_id, n, pid) VALUES (%s, %s, %s, %s)",
                     (envelope.message_id, envelope.aggregate_id, n, os.getpid()))


ORDER_REGISTRY = Registry(default="helpers.inprocess_handlers:record_order")


async def record_order_or_poison(envelope, tx) -> None:
    """record_order, except for a planted poison event (payload `poison`), which nothing can handle."""
    if envelope.payload.get("poison"):
        raise Poison("planted poison")
    await record_order(envelope, tx)


ORDER_POISON_REGISTRY = Registry(default="helpers.inprocess_handlers:record_order_or_poison")


async def nothing(envelope, tx) -> None:
    """Handles by doing nothing: what is measured is seamq's own work (and the audit's)."""


NOTHING_REGISTRY = Registry(default="helpers.inprocess_handlers:nothing")
