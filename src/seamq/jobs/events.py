"""The job events (`GET /ojs/v1/events`): CloudEvents of what this server did, the last 10,000, counted
into its throughput meter as they pass.

Kept in the server's memory, as the workers it heard from and its throughput
are (the admin API says `scope: server`): storing them in NATS cost nats-server
three stored writes per job, which halved the rate at which jobs are processed
(measured, docs/benchmarks.md). With several servers, each lists its own.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Callable

from seamq.jobs import model
from seamq.jobs.activity import Meter

EVENTS_KEPT = 10_000
METERED = {"job.completed": "processed", "job.retrying": "failed", "job.discarded": "failed",
           "job.enqueued": "enqueued"}


class Events:
    def __init__(self, clock: Callable = model.utcnow) -> None:
        self.clock = clock
        self.meter = Meter()
        # (seq, type, queue, JSON): ten thousand of them as dicts would cost the server 12 MB
        self.kept: deque[tuple[int, str, str, bytes]] = deque(maxlen=EVENTS_KEPT)
        self.seq = 0

    async def emit(self, kind: str, record: dict, **data: Any) -> None:
        now = self.clock()
        queue = record.get("queue") or ""
        event = {
            "specversion": "1.0", "id": f"evt_{model.uuid7()}", "type": kind, "source": "seamq/jobs",
            "time": model.iso(now), "subject": record["id"],
            "data": {"job_id": record["id"], "job_type": record.get("type"), "queue": record.get("queue"),
                     "attempt": record.get("attempt"), **data},
        }
        self.seq += 1
        self.kept.append((self.seq, kind, queue, json.dumps(event, separators=(",", ":")).encode()))
        metered = METERED.get(kind)
        if metered and queue:
            self.meter.count(metered, queue, now)

    def clear(self) -> None:
        self.kept.clear()

    def list(self, types: list[str], queues: list[str], limit: int, after: int = 0) -> dict:
        """Events after the cursor `after`, of `types` and `queues` when named, up to `limit`."""
        found = [e for e in self.kept if e[0] > after and (not types or e[1] in types) and (not queues or e[2] in queues)]
        page = found[:limit]
        return {"events": [json.loads(e[3]) for e in page], "cursor": str(page[-1][0]) if page else str(after),
                "has_more": len(found) > limit}
