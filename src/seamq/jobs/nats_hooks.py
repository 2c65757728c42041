"""Webhook deliveries on NATS (seamq.jobs.ports.HookQueue): the event log read once by all servers
together, and a work queue of deliveries.

- A durable pull consumer of `OJS_EVENTS` (`webhooks-fanout`), shared by every server: each batch of
  events goes to one of them, which turns it into deliveries and acks it; a server that dies first
  leaves it to another after the ack wait.
- Stream `OJS_WEBHOOKS` (work queue): one message per event and subscription, its message id the
  delivery's, so a batch read twice makes each delivery once (within the 2 minutes NATS remembers
  ids, well over the fan-out's ack wait). A durable pull consumer (`webhooks-deliver`), shared by
  every server, hands each delivery to one; a failed attempt is put back with the delay before the
  next, and a server that dies mid-attempt leaves it to another after the ack wait.
"""

from __future__ import annotations

import nats.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

from seamq.jobs.nats_ready import EVENTS
from seamq.jobs.ports import Delivery, EventBatch

HOOKS, FANOUT, DELIVER = "OJS_WEBHOOKS", "webhooks-fanout", "webhooks-deliver"
FANOUT_WAIT = 30.0  # seconds a server holds a batch of events it turns into deliveries
DELIVER_WAIT = 90.0  # seconds a server holds a delivery: past a receiver's 30 s, with room


class NatsHooks:
    def __init__(self, nc: Client, *, replicas: int = 1) -> None:
        self.js, self.replicas = nc.jetstream(), replicas
        self._events = self._deliveries = None

    async def start(self) -> "NatsHooks":
        config = StreamConfig(name=HOOKS, subjects=["ojs.webhooks.>"], retention=RetentionPolicy.WORK_QUEUE,
                              storage=StorageType.FILE, num_replicas=self.replicas, duplicate_window=120.0)
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await self.js.update_stream(config)
        self._events = await self.js.pull_subscribe(
            "ojs.events", durable=FANOUT, stream=EVENTS,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=FANOUT_WAIT, deliver_policy=DeliverPolicy.NEW,
                                  max_ack_pending=100))
        self._deliveries = await self.js.pull_subscribe(
            "ojs.webhooks.>", durable=DELIVER, stream=HOOKS,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=DELIVER_WAIT, max_ack_pending=1000))
        return self

    async def batches(self, most: int, timeout: float) -> list[EventBatch]:
        return [EventBatch(m, m.metadata.sequence.stream, m.data) for m in await self._fetch(self._events, most, timeout)]

    async def deliveries(self, most: int, timeout: float) -> list[Delivery]:
        return [Delivery(m, m.data, m.metadata.num_delivered) for m in await self._fetch(self._deliveries, most, timeout)]

    @staticmethod
    async def _fetch(subscription, most: int, timeout: float) -> list:
        try:
            return await subscription.fetch(most, timeout=timeout)
        except TimeoutError:  # nats-py's, or asyncio's when its time ran out between its two pull requests
            return []

    async def queue(self, delivery_id: str, sub_id: str, payload: bytes) -> None:
        await self.js.publish(f"ojs.webhooks.{sub_id}", payload, headers={"Nats-Msg-Id": delivery_id})

    async def done(self, handle: object) -> None:
        await handle.ack()  # type: ignore[attr-defined]

    async def again(self, handle: object, seconds: float) -> None:
        await handle.nak(delay=seconds)  # type: ignore[attr-defined]

    async def dropped(self, handle: object) -> None:
        await handle.term()  # type: ignore[attr-defined]

    async def close(self) -> None:
        for subscription in (self._events, self._deliveries):
            if subscription is not None:
                await subscription.unsubscribe()
