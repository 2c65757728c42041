"""The job store port (seamq.jobs.ports.JobStore) on NATS: one adapter, its parts by what they keep.

- seamq.jobs.nats_records: the records, KV `OJS_JOBS` written by compare-and-set in atomic
  batches, and the unique-job locks, KV `OJS_UNIQUE`;
- seamq.jobs.nats_ready: the ready order held as leases, stream `OJS_READY`, and the logs of
  finished jobs, stream `OJS_DONE`, and of events, stream `OJS_EVENTS`;
- seamq.jobs.nats_clocks: the timers as message schedules, stream `OJS_TIMERS`, and the jobs
  relayed from outboxes, stream `OJS_ENQUEUE`.

Every resource is made at start if missing (with `replicas` copies), so any number of servers
start on one NATS in any order. The engine sees records as dicts and revisions as ints; of
nats-py's types only the opaque handles of fired timers and relayed jobs leave the adapter.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError

from seamq.jobs.nats_clocks import TIMERS, Clocks
from seamq.jobs.nats_ready import DONE, EVENTS, READY, ReadyOrder
from seamq.jobs.nats_records import JOBS, UNIQUE, Records
from seamq.model import JOBS_STREAM
from seamq.nats.provision import cluster_size
from seamq.nats.replies import Replies

FOLLOWED = ("queue.", "system.", "limit.", "schema.", "cron.", "prio.")  # wiped with delete markers


class NatsJobStore(Records, ReadyOrder, Clocks):
    def __init__(self, nc: Client, *, replicas: int | None = None) -> None:
        """`replicas`: copies of each stream in a cluster; by default 3 in a cluster of 3 or more, else 1."""
        self.nc, self.js = nc, nc.jetstream()
        self.replicas = replicas or (3 if (cluster_size(self.js) or 1) >= 3 else 1)
        self.replies = Replies(nc)
        self._tasks: list[asyncio.Task] = []
        self._timers = self._intake = None

    async def start(self) -> "NatsJobStore":
        await self.replies.start()
        await self._start_records()
        await self._start_clocks()
        await self._start_ready()
        return self

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_ready()
        await self._close_clocks()
        await self.replies.close()

    async def _stream(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except BadRequestError:  # it exists: as configured now
            await self.js.update_stream(config)

    def reachable(self) -> bool:
        return self.nc.is_connected

    async def wipe(self) -> None:
        """Empty every OJS bucket and stream (`POST /ojs/v1/admin/reset`, test mode)."""
        for key in [r["_key"] for prefix in FOLLOWED for r, _ in await self.scan(prefix) if "_key" in r]:
            await self.jobs.delete(key)  # each server following it hears that it is gone
        for stream in (f"KV_{JOBS}", f"KV_{UNIQUE}", TIMERS, JOBS_STREAM, READY, DONE, EVENTS):
            await self.js.purge_stream(stream)
        self._priorities.clear()
