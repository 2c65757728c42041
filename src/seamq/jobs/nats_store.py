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

import asyncio
import json
from datetime import datetime

from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from seamq.jobs import store as v1
from seamq.jobs.ports import Conflict, Fired, Taken, Write

READY = "OJS_READY"
FETCH_WAIT = 2.0  # a bound only: the first pull is no_wait, answered at once (a short one lost late replies)


def _subject(queue: str, priority: int) -> str:
    return f"ojs.ready.{queue}.p{priority + 100:03d}"


class NatsJobStore:
    def __init__(self, nc: Client, *, timer_ack_wait: float = 30) -> None:
        self.nc, self.js = nc, nc.jetstream()
        self.v1 = v1.JobStore(nc)
        self.timer_ack_wait = timer_ack_wait
        self._made: set[str] = set()  # consumers known to exist
        self._free: dict[str, list] = {}  # idle pull subscriptions per subject: one fetch on each at a time

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
        for subs in self._free.values():
            for sub in subs:
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

    async def offer(self, queue: str, priority: int, job_id: str, revision: int) -> None:
        await self.js.publish(_subject(queue, priority), json.dumps({"id": job_id, "rev": revision}).encode())

    async def _sub(self, subject: str):
        """An idle pull subscription on the subject's consumer (nats-py's fetch is one at a time on each)."""
        durable = "ready-" + subject.removeprefix("ojs.ready.").encode().hex()
        if subject not in self._made:
            await self.js.add_consumer(READY, ConsumerConfig(
                durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
                max_deliver=-1, deliver_policy=DeliverPolicy.ALL, max_ack_pending=100_000))
            self._made.add(subject)
        free = self._free.setdefault(subject, [])
        return free.pop() if free else await self.js.pull_subscribe_bind(consumer=durable, stream=READY)

    async def waiting(self, queue: str) -> dict[int, int]:
        info = await self.js.stream_info(READY, subjects_filter=f"ojs.ready.{queue}.*")
        return {int(s.rsplit(".p", 1)[1]) - 100: n for s, n in (info.state.subjects or {}).items() if n}

    async def take(self, queue: str, count: int, hold_seconds: float) -> list[Taken]:
        out: list[Taken] = []
        for priority in sorted(await self.waiting(queue), reverse=True):
            if len(out) >= count:
                break
            subject = _subject(queue, priority)
            sub = await self._sub(subject)
            try:
                messages = await sub.fetch(count - len(out), timeout=FETCH_WAIT)
            except (NatsTimeout, asyncio.TimeoutError):
                continue
            finally:
                self._free[subject].append(sub)
            for m in messages:
                await self._nak(m.reply, hold_seconds)  # the hold
                body = json.loads(m.data)
                out.append(Taken(body["id"], body["rev"], str(m.metadata.sequence.stream), m.reply,
                                 m.metadata.num_delivered))
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
