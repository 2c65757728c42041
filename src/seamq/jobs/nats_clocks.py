"""The job store's clocks and intake on NATS. Part of seamq.jobs.nats_store's adapter.

- Stream `OJS_TIMERS` (`allow_msg_schedules`, one message per subject): a timer is an `@at`
  schedule on `ojs.sched.{kind}.{queue}.{id}`; the server publishes it to `ojs.fire...` when due,
  where one durable consumer hands it to one job server. A new timer for the same job and kind
  replaces the old one, and timers survive restarts of both nats-server and the job servers.
- Stream `OJS_ENQUEUE` (work queue): jobs enqueued in a database transaction (seamq.jobs.enqueue),
  published by the relay from the outbox with the job id as `Nats-Msg-Id`; the durable consumer
  `ojs-intake` hands them to a job server.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from seamq.jobs.nats_records import NatsRecords, made
from seamq.jobs.ports import Fired
from seamq.jobs.route import ROUTE
from seamq.nats.pull import PullSource
from seamq.nats.wire import header_block

TIMERS, TIMER_CONSUMER, INTAKE_CONSUMER = "OJS_TIMERS", "ojs-timers", "ojs-intake"
DUPLICATE_WINDOW = 3600.0  # seconds: a relay re-publishing a job (killed before it marked it) is dropped


class NatsClocks:
    def __init__(self, records: NatsRecords) -> None:
        self.records, self.nc, self.js, self.replicas = records, records.nc, records.js, records.replicas
        self._timers: PullSource | None = None
        self._intake: PullSource | None = None

    async def start(self) -> None:
        await made(self.js, StreamConfig(name=TIMERS, subjects=["ojs.sched.>", "ojs.fire.>"], allow_msg_schedules=True,
                                        max_msgs_per_subject=1, storage=StorageType.FILE, max_age=30 * 86400,
                                        num_replicas=self.replicas))
        await self.js.add_consumer(TIMERS, ConsumerConfig(
            durable_name=TIMER_CONSUMER, filter_subject="ojs.fire.>", ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
            deliver_policy=DeliverPolicy.ALL, max_ack_pending=10_000))
        # A standing pull: a fired timer is handed over the moment it arrives (a fetch of a batch
        # would wait for the batch or its timeout).
        self._timers = await PullSource(self.nc, TIMERS, TIMER_CONSUMER, buffer=200).start()
        await made(self.js, StreamConfig(name=ROUTE.stream, subjects=[ROUTE.subject], retention=RetentionPolicy.WORK_QUEUE,
                                        storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW,
                                        num_replicas=self.replicas))
        await self.js.add_consumer(ROUTE.stream, ConsumerConfig(
            durable_name=INTAKE_CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=-1,
            deliver_policy=DeliverPolicy.ALL, max_ack_pending=1000))
        self._intake = await PullSource(self.nc, ROUTE.stream, INTAKE_CONSUMER, buffer=200).start()

    async def close(self) -> None:
        for source in (self._timers, self._intake):
            if source is not None:
                await source.close()
        self._timers = self._intake = None

    # ---- timers -------------------------------------------------------------------------------

    async def arm(self, kind: str, key: str, at: datetime, token: dict) -> None:
        stamp = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        await self.records.published(f"ojs.sched.{kind}.{key}", json.dumps(token).encode(), header_block({
            "Nats-Schedule": f"@at {stamp}", "Nats-Schedule-Target": f"ojs.fire.{kind}.{key}"}))

    async def disarm(self, kind: str, key: str) -> None:
        try:
            await self.js.purge_stream(TIMERS, subject=f"ojs.sched.{kind}.{key}")
        except NotFoundError:
            pass

    async def fired(self, batch: int = 100, timeout: float = 1.0) -> list[Fired]:
        out = []
        for m in await self._timers.fetch(batch, timeout):
            _, _, kind, key = m.subject.split(".", 3)
            try:
                token = json.loads(m.data)
            except ValueError:
                token = {}
            out.append(Fired(kind, key, token, m, m.metadata.num_delivered))
        return out

    async def done(self, fired: Fired) -> None:
        await fired.handle.ack()

    async def again(self, fired: Fired, seconds: float) -> None:
        await fired.handle.nak(delay=seconds)

    # ---- intake: jobs enqueued in a database transaction (seamq.jobs.intake) -----------------------

    async def taken_in(self, batch: int = 100, timeout: float = 1.0) -> list[tuple[bytes, object]]:
        """(push body as sent, ack handle) of relayed jobs."""
        return [(m.data, m) for m in await self._intake.fetch(batch, timeout)]

    async def later(self, handle, delay: float) -> None:
        await handle.nak(delay=delay)

    async def intake_done(self, handle) -> None:
        await handle.ack()
