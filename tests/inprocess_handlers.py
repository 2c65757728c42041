"""In-process handlers for consumer tests run in a subprocess (importable via PYTHONPATH)."""

import asyncio
import os

from seamq.registry import Registry


async def count_side_effect(envelope, tx) -> None:
    """Writes its side effect in the inbox transaction; no unique key, so doubles would show."""
    await tx.execute("INSERT INTO side_effects (message_id, aggregate_id) VALUES (%s, %s)",
                     (envelope.message_id, envelope.aggregate_id))
    await asyncio.sleep(float(os.environ.get("HANDLER_SLEEP", "0")))


REGISTRY = Registry(default="inprocess_handlers:count_side_effect")


async def record_v1(envelope, tx) -> None:
    await tx.execute("INSERT INTO handled (message_id, version, handler) VALUES (%s, %s, 'v1')",
                     (envelope.message_id, envelope.event_version))


async def record_v2(envelope, tx) -> None:
    await tx.execute("INSERT INTO handled (message_id, version, handler) VALUES (%s, %s, 'v2')",
                     (envelope.message_id, envelope.event_version))
