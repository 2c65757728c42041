"""The job events (`GET /ojs/v1/events`): CloudEvents kept in the store, so that every server lists
the same ones whichever made them, and counted into the server's throughput meter as they pass.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from seamq.jobs import model
from seamq.jobs.activity import Meter
from seamq.jobs.ports import JobStore

EVENTS_KEPT = 10_000  # the most recent; the store keeps no more
METERED = {"job.completed": "processed", "job.retrying": "failed", "job.discarded": "failed",
           "job.enqueued": "enqueued"}


class Events:
    def __init__(self, store: JobStore, clock: Callable = model.utcnow) -> None:
        self.store, self.clock = store, clock
        self.meter = Meter()

    async def emit(self, kind: str, record: dict, **data: Any) -> None:
        now = self.clock()
        queue = record.get("queue") or ""
        event = {
            "specversion": "1.0", "id": f"evt_{model.uuid7()}", "type": kind, "source": "seamq/jobs",
            "time": model.iso(now), "subject": record["id"],
            "data": {"job_id": record["id"], "job_type": record.get("type"), "queue": record.get("queue"),
                     "attempt": record.get("attempt"), **data},
        }
        await self.store.emit(queue, kind, json.dumps(event, separators=(",", ":")).encode())
        metered = METERED.get(kind)
        if metered and queue:
            self.meter.count(metered, queue, now)

    async def list(self, types: list[str], queues: list[str], limit: int, after: int = 0) -> dict:
        """Events after the cursor `after`, of `types` and `queues` when named, up to `limit`."""
        found: list[tuple[int, bytes]] = []
        cursor, more = after, False
        while True:
            batch = await self.store.events(cursor, 1000)
            for seq, queue, kind, event in batch:
                if (not types or kind in types) and (not queues or queue in queues):
                    if len(found) == limit:
                        more = True
                        break
                    found.append((seq, event))
            if more or len(batch) < 1000:
                break
            cursor = batch[-1][0]
        return {"events": [json.loads(e) for _, e in found], "cursor": str(found[-1][0]) if found else str(after),
                "has_more": more}
