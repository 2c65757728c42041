"""Webhooks at work: the subscriptions (records every server follows, as the queues' flags are) and
the deliverer, which turns the event log into deliveries and makes them (seamq.jobs.webhooks says
what a delivery is; seamq.jobs.ports.HookQueue where they wait).

Every server runs a deliverer; the queue hands each batch of events and each delivery to one of them
at a time. A delivery is tried at once, then after the spec's delays (30 s, 2 min, ... 24 h: 8
attempts), and recorded after each attempt (`whd.` records, kept for the records' retention): its
attempts' answers or errors, and whether it was delivered, is waiting to be tried again or is dead
(a 4xx other than 429, or no attempt left). A receiver that was down gets each event when its next
attempt comes; webhook delivery never slows a job.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any, Callable

from seamq import codec
from seamq.jobs import webhooks
from seamq.jobs.events import cloud_events
from seamq.jobs.model import conflict, iso, utcnow
from seamq.jobs.ports import Conflict, Delivery, HookQueue, JobStore, Post, Write
from seamq.jobs.queues import Queues
from seamq.model import describe
from seamq.observability import log
from seamq.redact import redact

AT_ONCE = 16  # deliveries a server makes at the same time
KEPT_ATTEMPTS = 10  # a delivery's record keeps its last attempts' answers


def record_key(sub_id: str, delivery_id: str) -> str:
    return f"whd.{sub_id}.{delivery_id}"


class Subscriptions:
    def __init__(self, store: JobStore, queues: Queues, clock: Callable[[], datetime] = utcnow) -> None:
        self.store, self.queues, self.clock = store, queues, clock

    def all(self) -> list[dict]:
        """As this server follows them (the deliverer's, at each batch of events)."""
        return sorted(self.queues.of(webhooks.PREFIX), key=lambda r: r["created_at"])

    async def listing(self) -> list[dict]:
        """As stored: one made through another server a moment ago too (a client's read after its write)."""
        return sorted((record for record, _ in await self.store.scan(webhooks.PREFIX)), key=lambda r: r["created_at"])

    async def find(self, sub_id: str) -> dict | None:
        """As this server follows it, else as stored (made through another server a moment ago)."""
        found = self.queues.flags.get(webhooks.key(sub_id))
        if found is None and (held := await self.store.get(webhooks.key(sub_id))) is not None:
            found = held.record
        return found

    async def get(self, sub_id: str) -> dict:
        found = await self.find(sub_id)
        if found is None:
            raise webhooks.not_found(sub_id)
        return found

    async def create(self, body: Any) -> tuple[dict, str | None]:
        record, made = webhooks.created(body, self.clock())
        await self.store.commit([Write(record["_key"], record, 0)])
        self.queues.kept(record["_key"], record)
        return record, made

    async def update(self, sub_id: str, body: Any) -> dict:
        held = await self.store.get(webhooks.key(sub_id))
        if held is None:
            raise webhooks.not_found(sub_id)
        record = webhooks.updated(held.record, body, self.clock())
        try:
            await self.store.commit([Write(record["_key"], record, held.revision)])
        except Conflict:
            raise conflict(f"subscription {sub_id} changed meanwhile; read it again") from None
        self.queues.kept(record["_key"], record)
        return record

    async def rotate(self, sub_id: str, body: Any) -> tuple[dict, str]:
        held = await self.store.get(webhooks.key(sub_id))
        if held is None:
            raise webhooks.not_found(sub_id)
        record, secret = webhooks.rotated(held.record, body, self.clock())
        try:
            await self.store.commit([Write(record["_key"], record, held.revision)])
        except Conflict:
            raise conflict(f"subscription {sub_id} changed meanwhile; try again") from None
        self.queues.kept(record["_key"], record)
        return record, secret

    async def delete(self, sub_id: str) -> None:
        """Gone at once for every server: its waiting deliveries are dropped as they come."""
        await self.get(sub_id)
        await self.store.delete(webhooks.key(sub_id))
        self.queues.kept(webhooks.key(sub_id), None)

    async def deliveries(self, sub_id: str) -> list[dict]:
        await self.get(sub_id)
        found = [stored.record for stored in await self.store.scan(f"whd.{sub_id}.")]
        return sorted(found, key=lambda r: r["first_at"], reverse=True)


class Deliverer:
    def __init__(self, queue: HookQueue, store: JobStore, subscriptions: Subscriptions, post: Post, *,
                 schedule: tuple[float, ...] = webhooks.SCHEDULE, timeout: float = webhooks.TIMEOUT) -> None:
        self.queue, self.store, self.subscriptions, self.post = queue, store, subscriptions, post
        self.schedule, self.timeout = schedule, timeout

    async def run(self) -> None:
        """Until cancelled: both halves, each going on through NATS or a receiver being away."""
        await asyncio.gather(self._forever(self.fan_out), self._forever(self.deliver))

    async def _forever(self, step: Callable[[], Any]) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("ojs_webhooks_step_failed", step=step.__name__, error=describe(exc))
                await asyncio.sleep(1.0)

    async def fan_out(self, timeout: float = 1.0) -> int:
        """Turn the batches of events that came into deliveries, one per event and subscription."""
        made = 0
        for batch in await self.queue.batches(10, timeout):
            subscriptions = [s for s in self.subscriptions.all() if s.get("active", True)]
            for _, event in cloud_events(batch.seq, batch.data) if subscriptions else ():
                for subscription in subscriptions:
                    if webhooks.matches(subscription, event):
                        delivery = webhooks.delivery_id(subscription["id"], event["id"])
                        await self.queue.queue(delivery, subscription["id"],
                                               codec.dumps({"id": delivery, "sub": subscription["id"], "event": event}))
                        made += 1
            await self.queue.done(batch.handle)
        return made

    async def deliver(self, timeout: float = 1.0) -> int:
        taken = await self.queue.deliveries(AT_ONCE, timeout)
        await asyncio.gather(*(self._attempt(delivery) for delivery in taken))
        return len(taken)

    async def _attempt(self, delivery: Delivery) -> None:
        wanted = codec.loads(delivery.data)
        subscription = await self.subscriptions.find(wanted["sub"])
        if subscription is None or not subscription.get("active", True):
            await self.queue.dropped(delivery.handle)  # deleted or paused meanwhile: nobody wants it
            return
        event, now = wanted["event"], int(time.time())
        body = codec.dumps(event)
        started = time.monotonic()
        status, error = await self.post(subscription["url"], body,
                                        webhooks.headers(subscription, event, wanted["id"], now, body), self.timeout)
        took = round((time.monotonic() - started) * 1000)
        verdict, wait = webhooks.outcome(status), webhooks.retry_in(delivery.attempt, self.schedule)
        if verdict == "retry" and wait is None:
            verdict = "dead"
        await self._record(wanted, event, delivery.attempt, status, error, took, verdict)
        if verdict == "delivered":
            await self.queue.done(delivery.handle)
        elif verdict == "dead":
            log.warning("ojs_webhook_dead", subscription=wanted["sub"], delivery=wanted["id"], status=status,
                        error=error, url=redact(subscription["url"]), attempts=delivery.attempt)
            await self.queue.dropped(delivery.handle)
        else:
            log.info("ojs_webhook_retrying", subscription=wanted["sub"], delivery=wanted["id"], status=status,
                     error=error, attempt=delivery.attempt, retry_in_s=wait)
            await self.queue.again(delivery.handle, wait or 0.0)

    async def _record(self, wanted: dict, event: dict, attempt: int, status: int | None, error: str | None,
                      took: int, verdict: str) -> None:
        key = record_key(wanted["sub"], wanted["id"])
        held = await self.store.get(key)
        before = held.record if held else {"delivery_id": wanted["id"], "subscription_id": wanted["sub"],
                                           "event_id": event["id"], "event_type": event["type"], "first_at": iso(utcnow()),
                                           "attempts": []}
        tried = {"attempt": attempt, "at": iso(utcnow()), "status_code": status, "error": error, "duration_ms": took}
        record = {**before, "state": verdict if verdict != "retry" else "retrying", "attempt": attempt,
                  "attempts": [*before["attempts"], tried][-KEPT_ATTEMPTS:]}
        try:
            await self.store.commit([Write(key, record, None, finished=True)])
        except Exception as exc:  # the delivery goes on; only its record is short
            log.warning("ojs_webhook_unrecorded", delivery=wanted["id"], error=describe(exc))
