"""The job events (`GET /ojs/v1/events`): CloudEvents of what this server did, the last 10,000, counted
into its throughput meter as they pass.

Kept in the server's memory, as the workers it heard from and its throughput
are (the admin API says `scope: server`): storing them in NATS cost nats-server
three stored writes per job, which halved the rate at which jobs are processed
(measured, docs/benchmarks.md). With several servers, each lists its own.
An event is kept as the few values it is made of and shaped as a CloudEvent
only when listed: two are emitted per processed job, and building each one's
JSON as it passed cost a tenth of the engine's CPU per job (measured).
"""

from __future__ import annotations

import random
import uuid
from collections import deque
from datetime import datetime
from typing import Any, Callable, NamedTuple

from seamq.jobs import model
from seamq.jobs.activity import Meter

EVENTS_KEPT = 10_000
METERED = {"job.completed": "processed", "job.retrying": "failed", "job.discarded": "failed",
           "job.enqueued": "enqueued"}


class Event(NamedTuple):
    seq: int
    type: str
    queue: str
    time: datetime
    subject: str
    job_type: Any
    attempt: Any
    data: dict | None


class Events:
    def __init__(self, clock: Callable = model.utcnow) -> None:
        self.clock = clock
        self.meter = Meter()
        self.kept: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.seq = 0
        self._nonce = random.getrandbits(62)  # this server's events' ids differ from every other's

    async def emit(self, kind: str, record: dict, **data: Any) -> None:
        now = self.clock()
        queue = record.get("queue") or ""
        self.seq += 1
        self.kept.append(Event(self.seq, kind, queue, now, record["id"], record.get("type"), record.get("attempt"),
                               data or None))
        metered = METERED.get(kind)
        if metered and queue:
            self.meter.count(metered, queue, now)

    def clear(self) -> None:
        self.kept.clear()

    def list(self, types: list[str], queues: list[str], limit: int, after: int = 0) -> dict:
        """Events after the cursor `after`, of `types` and `queues` when named, up to `limit`."""
        found = [e for e in self.kept if e.seq > after and (not types or e.type in types)
                 and (not queues or e.queue in queues)]
        page = found[:limit]
        return {"events": [self._cloud_event(e) for e in page], "cursor": str(page[-1].seq) if page else str(after),
                "has_more": len(found) > limit}

    def _cloud_event(self, e: Event) -> dict:
        return {"specversion": "1.0", "id": f"evt_{self._id(e)}", "type": e.type, "source": "seamq/jobs",
                "time": model.iso(e.time), "subject": e.subject,
                "data": {"job_id": e.subject, "job_type": e.job_type, "queue": e.queue or None, "attempt": e.attempt,
                         **(e.data or {})}}

    def _id(self, e: Event) -> uuid.UUID:
        """A UUIDv7 of the event's time, the same each time it is listed: the sequence in the 12 bits
        after the version, this server's nonce plus the sequence in the 62 random bits."""
        ms = int(e.time.timestamp() * 1000) & (2 ** 48 - 1)
        return uuid.UUID(int=(ms << 80) | (0x7 << 76) | ((e.seq & 0xFFF) << 64) | (0b10 << 62)
                         | ((self._nonce + e.seq) & (2 ** 62 - 1)))
