"""The job store port on NATS (engine v2): records and timers as seamq.jobs.store keeps them, and the
ready order as a JetStream work-queue stream held as leases.

- Stream `OJS_READY` (work queue), a subject per queue and priority:
  `ojs.ready.{queue}.p{priority + 100:03d}`, one durable pull consumer each, shared by every server.
  An entry is `{"id", "rev"}`. Taking an entry NAKs it at once with a delay: that is the hold, and
  JetStream delivers it again after the delay unless it is acked first (`+ACK`, from any connection,
  to the reply subject the job's record keeps). A heartbeat is another NAK with a delay.
- The order between priorities is the engine's: it asks which subjects hold entries
  (`stream_info` with a subject filter) and takes from the highest first; within a subject,
  JetStream's order is first in, first out, with entries that come again before later ones.
"""

from __future__ import annotations

import json
from datetime import datetime

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from seamq.jobs import store as v1
from seamq.jobs.ports import Conflict, Fired, Taken, Write

READY = "OJS_READY"
REPLY_WAIT = 5.0  # seconds for the server's answer to a no_wait pull (it answers at once; this only bounds it)


def _subject(queue: str, priority: int) -> str:
    return f"ojs.ready.{queue}.p{priority + 100:03d}"


class NatsJobStore:
    def __init__(self, nc: Client, *, timer_ack_wait: float = 30) -> None:
        self.nc, self.js = nc, nc.jetstream()
        self.v1 = v1.JobStore(nc)
        self.timer_ack_wait = timer_ack_wait
        self._made: set[str] = set()  # consumers known to exist
        self._inboxes: list = []  # idle reply subscriptions, one pull at a time on each

    async def start(self) -> "NatsJobStore":
        await self.v1.start()
        config = StreamConfig(name=READY, subjects=["ojs.ready.>"], retention=RetentionPolicy.WORK_QUEUE,
                              storage=StorageType.FILE)
        try:
            await self.js.add_stream(config)
        except BadRequestError:
            await self.js.update_stream(config)
        return self

    async def close(self) -> None:
        for _, sub in self._inboxes:
            await sub.unsubscribe()
        await self.v1.close()

    # ---- records: seamq.jobs.store's ----------------------------------------------------------------

    async def get(self, key: str) -> tuple[dict, int] | None:
        return await self.v1.get(key)

    async def commit(self, writes: list[Write]) -> list[int]:
        try:
            return await self.v1.commit([v1.Write(w.record, w.revision, w.finished) for w in writes])
        except v1.Conflict as exc:
            raise Conflict(str(exc)) from None

    async def delete(self, key: str) -> None:
        await self.v1.delete(key)

    # ---- the ready order ----------------------------------------------------------------------------

    async def offer(self, queue: str, priority: int, job_id: str, revision: int, record: dict | None = None) -> None:
        entry = {"id": job_id, "rev": revision, "record": record}
        await self.js.publish(_subject(queue, priority), json.dumps(entry, separators=(",", ":")).encode())

    async def _consumer(self, subject: str) -> str:
        durable = "ready-" + subject.removeprefix("ojs.ready.").encode().hex()
        if subject not in self._made:
            await self.js.add_consumer(READY, ConsumerConfig(
                durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
                max_deliver=-1, deliver_policy=DeliverPolicy.ALL, max_ack_pending=100_000))
            self._made.add(subject)
        return durable

    async def _pull_now(self, durable: str, count: int) -> list:
        """What the consumer can deliver now, up to `count`: one `no_wait` pull, answered at once.
        (nats-py's fetch adds `expires`, with which the server lets the pull linger, and it can then
        deliver an entry whose hold ends meanwhile.)"""
        inbox, sub = self._inboxes.pop() if self._inboxes else await self._new_inbox()
        try:
            await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{READY}.{durable}",
                                  json.dumps({"batch": count, "no_wait": True}).encode(), reply=inbox)
            out = []
            while len(out) < count:
                message = await sub.next_msg(timeout=REPLY_WAIT)
                if message.headers and message.headers.get("Status"):  # 404 no messages, 408 done
                    break
                out.append(message)
            self._inboxes.append((inbox, sub))  # a stray status later only ends a later pull early
            return out
        except Exception:
            await sub.unsubscribe()  # a late answer must not reach the next pull on this inbox
            raise

    async def _new_inbox(self):
        inbox = self.nc.new_inbox()
        return inbox, await self.nc.subscribe(inbox)

    async def waiting(self, queue: str) -> dict[int, int]:
        info = await self.js.stream_info(READY, subjects_filter=f"ojs.ready.{queue}.*")
        return {int(s.rsplit(".p", 1)[1]) - 100: n for s, n in (info.state.subjects or {}).items() if n}

    async def take(self, queue: str, count: int, hold_seconds: float) -> list[Taken]:
        out: list[Taken] = []
        for priority in sorted(await self.waiting(queue), reverse=True):
            if len(out) >= count:
                break
            durable = await self._consumer(_subject(queue, priority))
            messages = await self._pull_now(durable, count - len(out))
            for m in messages:
                await self._nak(m.reply, hold_seconds)  # the hold
                body = json.loads(m.data)
                out.append(Taken(body["id"], body["rev"], str(m.metadata.sequence.stream), m.reply,
                                 m.metadata.num_delivered, body.get("record")))
        return out

    async def _nak(self, reply: str, seconds: float) -> None:
        await self.nc.publish(reply, b"-NAK " + json.dumps({"delay": int(seconds * 1e9)}).encode())

    async def hold(self, hold: str, seconds: float) -> None:
        await self._nak(hold, seconds)

    async def settle(self, hold: str) -> None:
        await self.nc.publish(hold, b"+ACK")

    # ---- timers: seamq.jobs.store's ------------------------------------------------------------------

    async def arm(self, kind: str, key: str, at: datetime, token: dict) -> None:
        await self.v1.arm(kind, key, at, token)

    async def disarm(self, kind: str, key: str) -> None:
        await self.v1.disarm(kind, key)

    async def fired(self, batch: int = 100, timeout: float = 1.0) -> list[Fired]:
        return [Fired(kind, key, token, handle) for kind, key, token, handle in await self.v1.fired(batch, timeout)]

    async def done(self, fired: Fired) -> None:
        await self.v1.done(fired.handle)
