"""The soak's in-process handler: one side-effect row per call that succeeds, in the inbox
transaction. No unique key on purpose: a message handled twice shows as two rows. Each row says
which process handled it, when, and on which delivery: what a failed order check prints."""

import os

from seamq.envelope import Poison
from seamq.registry import Registry


async def count(envelope, tx) -> None:
    kind = envelope.payload.get("kind")
    if kind == "poison":
        raise Poison("soak poison")
    if kind == "flaky" and envelope.delivery_attempt == 1:
        raise RuntimeError("soak transient failure")
    await tx.execute("INSERT INTO soak_effects (message_id, aggregate_id, n, pid, attempt) VALUES (%s, %s, %s, %s, %s)",
                     (envelope.message_id, envelope.aggregate_id, envelope.payload["n"], os.getpid(),
                      envelope.delivery_attempt))


REGISTRY = Registry(default=count)
