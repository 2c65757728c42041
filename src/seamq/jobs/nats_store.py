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

import nats.errors
from nats.aio.client import Client
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError, ServiceUnavailableError

from seamq.jobs.nats_clocks import TIMERS, Clocks
from seamq.jobs.nats_ready import DONE, EVENTS, READY, ReadyOrder
from seamq.jobs.nats_records import JOBS, UNIQUE, Records
from seamq.jobs.route import ROUTE
from seamq.model import describe
from seamq.nats.provision import cluster_size
from seamq.nats.replies import Replies
from seamq.observability import log

START_BACKOFF = (0.5, 1, 2, 4, 5, 5, 5)  # seconds between the tries of a start
FOLLOWED = ("queue.", "system.", "limit.", "schema.", "cron.", "prio.", "worker.", "webhook.", "whd.", "pool.")  # wiped with delete markers


class NatsJobStore(Records, ReadyOrder, Clocks):
    def __init__(self, nc: Client, *, replicas: int | None = None) -> None:
        """`replicas`: copies of each stream in a cluster; by default 3 in a cluster of 3 or more, else 1."""
        self.nc, self.js = nc, nc.jetstream()
        self.replicas = replicas or (3 if (cluster_size(self.js) or 1) >= 3 else 1)
        self.replies = Replies(nc)
        self._tasks: list[asyncio.Task] = []
        self._timers = self._intake = None

    async def start(self) -> "NatsJobStore":
        """Make or update every resource, and start following. Servers started together on a new
        cluster ask the meta leader to make the same streams at once, and some of those requests
        time out (2 of 3 servers started at once failed so): each start is tried again, backing off."""
        await self.replies.start()
        for attempt, delay in enumerate(START_BACKOFF, 1):
            try:
                return await self._start_parts()
            except (nats.errors.TimeoutError, ServiceUnavailableError) as exc:
                log.warning("ojs_store_start_again", attempt=attempt, error=describe(exc))
                await self._stop_following()
                await asyncio.sleep(delay)
        return await self._start_parts()

    async def _start_parts(self) -> "NatsJobStore":
        await self._start_records()
        await self._start_clocks()
        await self._start_ready()
        return self

    async def _stop_following(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._close_clocks()
        self._timers = self._intake = None

    async def close(self) -> None:
        await self._stop_following()
        await self._close_ready()
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
        for stream in (f"KV_{JOBS}", f"KV_{UNIQUE}", TIMERS, ROUTE.stream, READY, DONE, EVENTS):
            await self.js.purge_stream(stream)
        self._priorities.clear()
