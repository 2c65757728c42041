"""The job events (`GET /ojs/v1/events`): CloudEvents of what every server did, the last 10,000, in
one log in the store that every server writes and reads, so that a cursor given by one server
reads on at any other.

Each server gathers its events and writes them as one batch every tenth of a second (one stored
write per batch: a write per event cost nats-server three per job and halved the rate at which jobs
are processed, measured in docs/benchmarks.md), and writes what it holds before it lists, so that a
client sees its own server's events at once and the others' within the tenth. An event is kept as
the few values it is made of and shaped as a CloudEvent only when listed. A cursor is the batch's
sequence times 10,000 plus the event's place in it. The throughput meter counts as events pass,
and stays each server's own (the admin API says `scope: server`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

from seamq import codec
from seamq.jobs import model
from seamq.jobs.activity import Meter
from seamq.jobs.ports import JobStore
from seamq.observability import log
from seamq.model import describe

EVENTS_KEPT = 10_000
PLACES = 10_000  # a cursor is a batch's sequence * PLACES + the event's place in it
PER_BATCH = PLACES - 1  # large: under load a write waits behind the jobs' own, and small batches fell behind
BATCH_BYTES = 512 * 1024  # a batch larger than this is split (NATS takes 1 MB a message by default)
EVERY = 0.1  # seconds between a server's batches
HELD_MOST = 100_000  # events held while the log cannot be written; older ones are dropped, and said
READ = 100  # batches read at a time
METERED = {"job.completed": "processed", "job.retrying": "failed", "job.discarded": "failed",
           "job.enqueued": "enqueued", "job.started": "dispatched"}


class Events:
    def __init__(self, store: JobStore, clock: Callable = model.utcnow) -> None:
        self.store, self.clock = store, clock
        self.meter = Meter()
        self.pending: list[list] = []  # [type, queue, ms, subject, job type, attempt, data]
        self._nonce = random.getrandbits(62)  # this server's events' ids differ from every other's
        self._writing = asyncio.Lock()

    async def emit(self, kind: str, record: dict, **data: Any) -> None:
        now = self.clock()
        queue = record.get("queue") or ""
        self.pending.append([kind, queue, int(now.timestamp() * 1000), record["id"], record.get("type"),
                             record.get("attempt"), data or None])
        metered = METERED.get(kind)
        if metered and queue:
            self.meter.count(metered, queue, now)

    async def run(self) -> None:
        """Write what was gathered, every tenth of a second, until cancelled."""
        while True:
            await asyncio.sleep(EVERY)
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: kept, and written with the next batch
                log.warning("ojs_events_unwritten", held=len(self.pending), error=describe(exc))

    async def flush(self) -> None:
        async with self._writing:  # batches in the order gathered
            if len(self.pending) > HELD_MOST:  # the log away or behind: the oldest go, and that is said
                log.warning("ojs_events_dropped", dropped=len(self.pending) - HELD_MOST, held=HELD_MOST)
                del self.pending[:len(self.pending) - HELD_MOST]
            while self.pending:
                batch = self.pending[:PER_BATCH]
                for part in _parts(self._nonce, batch):
                    await self.store.log(part)
                del self.pending[:len(batch)]  # only once written: a failure keeps them for the next try

    def clear(self) -> None:
        self.pending.clear()

    async def list(self, types: list[str], queues: list[str], limit: int, after: int = 0) -> dict:
        """Events after the cursor `after` (from the oldest kept when 0), of `types` and `queues` when
        named, up to `limit`."""
        await self.flush()
        start = after // PLACES if after else await self._oldest()
        found: list[tuple[int, dict]] = []
        while len(found) <= limit:
            batches = await self.store.logged(start, READ)
            for seq, data in batches:
                found += [(cursor, event) for cursor, event in cloud_events(seq, data) if cursor > after and
                          (not types or event["type"] in types) and (not queues or event["data"]["queue"] in queues)]
            if len(batches) < READ:
                break
            start = batches[-1][0]
        page = found[:limit]
        return {"events": [e for _, e in page], "cursor": str(page[-1][0] if page else after),
                "has_more": len(found) > limit}

    async def _oldest(self) -> int:
        """The sequence just before the batch that holds the oldest of the last EVENTS_KEPT events."""
        first, last = await self.store.log_bounds()
        counted, lowest = 0, last + 1
        while lowest > first > 0:
            start = max(first, lowest - READ)
            for seq, data in reversed(await self.store.logged(start - 1, lowest - start)):
                counted += int(data[:data.index(b"\n")])
                if counted >= EVENTS_KEPT:
                    return seq - 1
            lowest = start
        return max(first - 1, 0)


def cloud_events(seq: int, data: bytes) -> list[tuple[int, dict]]:
    """A batch of the log as stored (at sequence `seq`): its events as CloudEvents, each with its
    cursor; the same ids however often it is read (webhook deliveries are named after them)."""
    body = codec.loads(data[data.index(b"\n") + 1:])
    return [(seq * PLACES + place, _cloud_event(e, seq * PLACES + place, body["n"])) for place, e in enumerate(body["e"])]


def _parts(nonce: int, events: list[list]) -> list[bytes]:
    """A batch as stored: its count of events on the first line (counted without reading the rest),
    then the events; split in two while larger than BATCH_BYTES, and one event's data cut if alone
    it is."""
    data = b"%d\n" % len(events) + codec.dumps({"n": nonce, "e": events}, default=str)
    if len(data) <= BATCH_BYTES:
        return [data]
    if len(events) > 1:
        half = len(events) // 2
        return _parts(nonce, events[:half]) + _parts(nonce, events[half:])
    *head, extra = events[0]
    cut = {k: v for k, v in (extra or {}).items() if k != "result"} | {"result_omitted": f"{len(data)} bytes"}
    return [b"1\n" + codec.dumps({"n": nonce, "e": [[*head, cut]]}, default=str)]


def _cloud_event(e: list, cursor: int, nonce: int) -> dict:
    kind, queue, ms, subject, job_type, attempt, data = e
    moment = datetime.fromtimestamp(ms / 1000, timezone.utc)
    event_id = uuid.UUID(int=((ms & (2 ** 48 - 1)) << 80) | (0x7 << 76) | ((cursor & 0xFFF) << 64) | (0b10 << 62)
                         | ((nonce + cursor) & (2 ** 62 - 1)))
    return {"specversion": "1.0", "id": f"evt_{event_id}", "type": kind, "source": "seamq/jobs",
            "time": model.iso(moment), "subject": subject,
            "data": {"job_id": subject, "job_type": job_type, "queue": queue or None, "attempt": attempt,
                     **(data or {})}}
