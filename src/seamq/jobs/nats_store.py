"""The job store port (seamq.jobs.ports.JobStore) on NATS: one adapter made of three parts, each
keeping its own streams, each port method answered by the part that keeps what it touches.

- seamq.jobs.nats_records: the records, KV `OJS_JOBS` written by compare-and-set in atomic
  batches, and the unique-job locks, KV `OJS_UNIQUE`;
- seamq.jobs.nats_ready: the ready order held as leases, stream `OJS_READY`, and the log of
  events, stream `OJS_EVENTS`;
- seamq.jobs.nats_clocks: the timers as message schedules, stream `OJS_TIMERS`, and the jobs
  relayed from outboxes, stream `OJS_ENQUEUE`.

The ready order and the clocks write through the records part (its replies, its publish). Every
resource is made at start if missing (with `replicas` copies), so any number of servers
start on one NATS in any order. The engine sees records as dicts and revisions as ints; of
nats-py's types only the opaque handles of fired timers and relayed jobs leave the adapter.
"""

from __future__ import annotations

import asyncio

import nats.errors
from nats.aio.client import Client
from nats.js.errors import ServiceUnavailableError

from seamq.jobs.nats_clocks import TIMERS, NatsClocks
from seamq.jobs.nats_ready import EVENTS, READY, NatsReadyOrder
from seamq.jobs.nats_records import JOBS, UNIQUE, NatsRecords
from seamq.jobs.route import ROUTE
from seamq.model import describe
from seamq.nats.provision import cluster_size
from seamq.nats.replies import Replies
from seamq.observability import log

START_BACKOFF = (0.5, 1, 2, 4, 5, 5, 5)  # seconds between the tries of a start
FOLLOWED = ("queue.", "system.", "limit.", "schema.", "cron.", "prio.", "worker.", "webhook.", "whd.", "pool.")  # wiped with delete markers


class NatsJobStore:
    def __init__(self, nc: Client, *, replicas: int | None = None) -> None:
        """`replicas`: copies of each stream in a cluster; by default 3 in a cluster of 3 or more, else 1."""
        self.nc, self.js = nc, nc.jetstream()
        self.replicas = replicas or (3 if (cluster_size(self.js) or 1) >= 3 else 1)
        self.replies = Replies(nc)
        self.records = records = NatsRecords(nc, self.replies, self.replicas)
        self.ready = ready = NatsReadyOrder(records)
        self.clocks = clocks = NatsClocks(records)
        self.get, self.get_many, self.commit, self.commit_each, self.delete, self.scan, self.follow = (
            records.get, records.get_many, records.commit, records.commit_each, records.delete, records.scan,
            records.follow)
        self.lock_unique, self.take_unique = records.lock_unique, records.take_unique
        self.offer, self.withdraw, self.take, self.hold, self.settle = (
            ready.offer, ready.withdraw, ready.take, ready.hold, ready.settle)
        self.waiting, self.queues, self.ready_counts = ready.waiting, ready.queues, ready.ready_counts
        self.log, self.logged, self.log_bounds = ready.log, ready.logged, ready.log_bounds
        self.arm, self.disarm, self.fired, self.done, self.again = (
            clocks.arm, clocks.disarm, clocks.fired, clocks.done, clocks.again)
        self.taken_in, self.later, self.intake_done = clocks.taken_in, clocks.later, clocks.intake_done

    async def landed(self, key: str) -> None:
        """Each commit is answered to its caller: none is on its way here (seamq.jobs.tallied gathers them)."""

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
        await self.records.start()
        await self.clocks.start()
        await self.ready.start()
        return self

    async def _stop_following(self) -> None:
        await self.ready.stop_following()
        await self.clocks.close()

    async def close(self) -> None:
        await self.clocks.close()
        await self.ready.close()
        await self.replies.close()

    def reachable(self) -> bool:
        return self.nc.is_connected

    async def wipe(self) -> None:
        """Empty every OJS bucket and stream (`POST /ojs/v1/admin/reset`, test mode)."""
        for key in [r["_key"] for prefix in FOLLOWED for r, _ in await self.scan(prefix) if "_key" in r]:
            await self.records.jobs.delete(key)  # each server following it hears that it is gone
        for stream in (f"KV_{JOBS}", f"KV_{UNIQUE}", TIMERS, ROUTE.stream, READY, EVENTS):
            await self.js.purge_stream(stream)
        self.ready.forget()
