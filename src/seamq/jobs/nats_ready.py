"""The job store's ready order on NATS, held as leases, and its log of finished jobs. Part of
seamq.jobs.nats_store's adapter.

- Stream `OJS_READY` (work queue): an empty entry per available job, on
  `ojs.ready.{queue}.p{priority + 100:03d}.{id}`, written before the record that makes the job
  available; one durable pull consumer per queue and priority (`...p{nnn}.*`), shared by every
  server. A taken entry is held by the consumer's ack wait (30 s, ports.TAKEN_HOLD), or by a NAK
  with a delay (`hold`: a lease shorter than that, a heartbeat, what remains of a lease). JetStream
  delivers it again when the hold ends unless it is acked first (`+ACK`, from any connection, to
  the reply subject the job's record keeps). A job cancelled while it waits has its entry purged.
- The order between priorities is the store's: a queue's priorities are a record (`prio.{queue}`)
  that every server follows, and a take pulls from the highest first; within a priority,
  JetStream's order is first in, first out, with entries that come again before later ones.
- Stream `OJS_DONE`: an empty message per finished job on `ojs.done.{queue}.{state}`, kept for the
  records' retention; the counts of finished jobs are its subject counts.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

from seamq.jobs.nats_records import RECORD_TTL_SECONDS
from seamq.jobs.ports import TAKEN_HOLD, Conflict, Taken, Write
from seamq.observability import log
from seamq.model import describe

READY, DONE, EVENTS = "OJS_READY", "OJS_DONE", "OJS_EVENTS"
LOG_KEPT = 10_000  # batches of events
REPLY_WAIT = 5.0  # seconds for the server's answer to a no_wait pull (it answers at once; this only bounds it)
# A ready consumer's ack wait is the hold of an entry taken (ports.TAKEN_HOLD). As long as the default
# visibility timeout (1,800 s), it left jobs unseen for half an hour when the server that pulled them
# died before claiming them (the R3 kill test: 19 of 5,000 still available at its end).


def _subject(queue: str, priority: int, job_id: str = "*") -> str:
    return f"ojs.ready.{queue}.p{priority + 100:03d}.{job_id}"


class _PullInbox:
    """A pull's own inbox, read as its deliveries come. (nats-py's `next_msg` makes a UUID and an
    `asyncio.wait_for` for each message: 3% of the job server's CPU per job, measured.)"""

    __slots__ = ("subject", "sub", "messages", "arrived")

    @classmethod
    async def open(cls, nc) -> "_PullInbox":
        inbox = cls()
        inbox.subject, inbox.messages, inbox.arrived = nc.new_inbox(), deque(), asyncio.Event()
        inbox.sub = await nc.subscribe(inbox.subject, cb=inbox._delivered)
        return inbox

    async def _delivered(self, message) -> None:
        self.messages.append(message)
        self.arrived.set()

    async def next(self):
        while not self.messages:
            self.arrived.clear()
            await self.arrived.wait()
        return self.messages.popleft()


class ReadyOrder:
    async def _start_ready(self) -> None:
        self._made: set[str] = set()  # consumers known to exist
        self._inboxes: list = []  # idle pull subscriptions, one pull at a time on each (a delivery
        # names the entry's subject, not the inbox, so one wildcard inbox cannot tell the pulls apart)
        self._priorities: dict[str, set[int]] = {}  # queue -> the priorities its jobs were offered at
        self._registering: dict[tuple[str, int], asyncio.Future] = {}
        for config in (StreamConfig(name=READY, subjects=["ojs.ready.>"], retention=RetentionPolicy.WORK_QUEUE,
                                    storage=StorageType.FILE, num_replicas=self.replicas),
                       StreamConfig(name=DONE, subjects=["ojs.done.>"], max_age=RECORD_TTL_SECONDS,
                                    storage=StorageType.FILE, num_replicas=self.replicas),
                       StreamConfig(name=EVENTS, subjects=["ojs.events"], max_msgs=LOG_KEPT, max_bytes=256 * 2 ** 20,
                                    max_age=RECORD_TTL_SECONDS, allow_direct=True, storage=StorageType.FILE,
                                    num_replicas=self.replicas)):
            await self._stream(config)
        for record, _ in await self.scan("prio."):
            self._priorities[record["_key"].removeprefix("prio.")] = set(record["priorities"])
        self._tasks.append(asyncio.create_task(self._follow_priorities()))

    async def _close_ready(self) -> None:
        for inbox in self._inboxes:
            await inbox.sub.unsubscribe()

    async def offer(self, queue: str, priority: int, job_id: str) -> None:
        if priority not in self._priorities.get(queue, ()):
            # One registration for every offer waiting on it (a batch of 1,000 to a new queue made
            # 1,000, each a read and a CAS that all but one lost).
            pending = self._registering.get((queue, priority))
            if pending is None:
                pending = self._registering[queue, priority] = asyncio.ensure_future(self._register(queue, priority))
                pending.add_done_callback(lambda done: (self._registering.pop((queue, priority), None),
                                                        done.cancelled() or done.exception()))  # heard, if late
            await asyncio.shield(pending)
        await self.published(_subject(queue, priority, job_id), b"")  # the subject names the job

    async def withdraw(self, queue: str, priority: int, job_id: str) -> None:
        await self.js.purge_stream(READY, subject=_subject(queue, priority, job_id))

    async def _register(self, queue: str, priority: int) -> None:
        """A queue's priorities are a record every server follows: a take asks only those, highest
        first, with no request to find which subjects hold entries."""
        key = f"prio.{queue}"
        for _ in range(10):
            held = await self.get(key)
            known = {*(held.record["priorities"] if held else ()), priority}
            try:
                await self.commit([Write(key, {"_key": key, "priorities": sorted(known)}, held.revision if held else 0)])
            except Conflict:
                continue  # another server added one meanwhile
            self._priorities[queue] = known
            return
        raise Conflict(f"{key}: lost 10 compare-and-sets in a row to other servers")

    async def _follow_priorities(self) -> None:
        while True:
            try:
                async for key, record in self.follow(["prio."]):
                    if key:
                        self._priorities[key.removeprefix("prio.")] = set(record["priorities"] if record else ())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the client reconnects
                log.warning("ojs_follow_failed", error=describe(exc))
            await asyncio.sleep(0.5)

    async def _consumer(self, subject: str) -> str:
        durable = "ready-" + subject.removeprefix("ojs.ready.").removesuffix(".*").encode().hex()
        if subject not in self._made:
            await self.js.add_consumer(READY, ConsumerConfig(
                durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT, ack_wait=TAKEN_HOLD,
                max_deliver=-1, deliver_policy=DeliverPolicy.ALL, max_ack_pending=100_000))
            self._made.add(subject)
        return durable

    async def _pull_now(self, durable: str, count: int) -> list:
        """What the consumer can deliver now, up to `count`: one `no_wait` pull, answered at once.
        (nats-py's fetch adds `expires`, with which the server lets the pull linger, and it can then
        deliver an entry whose hold ends meanwhile.)"""
        inbox = self._inboxes.pop() if self._inboxes else await _PullInbox.open(self.nc)
        try:
            await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{READY}.{durable}",
                                  b'{"batch":%d,"no_wait":true}' % count, reply=inbox.subject)
            out = []
            async with asyncio.timeout(REPLY_WAIT):
                while len(out) < count:
                    message = await inbox.next()
                    if message.headers and message.headers.get("Status"):  # 404 no messages, 408 done
                        break
                    if message.reply and message.reply.startswith("$JS.ACK."):  # else a stray, not an entry
                        out.append(message)
            self._inboxes.append(inbox)  # a stray status later only ends a later pull early
            return out
        except BaseException:
            await inbox.sub.unsubscribe()  # a late answer must not reach the next pull on this inbox
            raise

    async def take(self, queue: str, count: int) -> list[Taken]:
        out: list[Taken] = []
        # The queue's priorities as last stored, not as the watch has told this server so far: a job
        # pushed through another server a moment ago may be at a priority (or in a queue) this one
        # has not heard of yet, and a fetch must find it (conformance, two servers, on a busy machine).
        held = await self.get(f"prio.{queue}")
        if held is not None:
            self._priorities[queue] = {*self._priorities.get(queue, ()), *held.record["priorities"]}
        for priority in sorted(self._priorities.get(queue, ()), reverse=True):
            if len(out) >= count:
                break
            durable = await self._consumer(_subject(queue, priority))
            for m in await self._pull_now(durable, count - len(out)):
                out.append(Taken(m.subject.rsplit(".", 1)[1], str(m.metadata.sequence.stream), m.reply,
                                 m.metadata.num_delivered))
        return out

    async def hold(self, hold: str, seconds: float) -> None:
        await self.nc.publish(hold, b'-NAK {"delay":%d}' % int(seconds * 1e9))

    async def settle(self, hold: str) -> None:
        await self.nc.publish(hold, b"+ACK")

    # ---- counts -------------------------------------------------------------------------------

    async def waiting(self, queue: str) -> dict[int, int]:
        out = {}
        for priority in self._priorities.get(queue, ()):
            info = await self.js.consumer_info(READY, await self._consumer(_subject(queue, priority)))
            if info.num_pending + info.num_ack_pending:
                out[priority] = info.num_pending + info.num_ack_pending
        return out

    async def ready_counts(self, queue: str) -> tuple[int, int]:
        waiting, held = 0, 0
        for priority in self._priorities.get(queue, ()):
            info = await self.js.consumer_info(READY, await self._consumer(_subject(queue, priority)))
            waiting += info.num_pending
            held += info.num_ack_pending
        return waiting, held

    async def queues(self) -> list[str]:
        await self.nc.flush()
        done = await self.js.stream_info(DONE, subjects_filter="ojs.done.>")
        return sorted({*self._priorities, *(s.removeprefix("ojs.done.").rsplit(".", 1)[0]
                                            for s in done.state.subjects or {})})

    async def finished(self, queue: str, state: str) -> None:
        await self.nc.publish(f"ojs.done.{queue}.{state}", b"")

    # ---- the event log ------------------------------------------------------------------------

    async def log(self, batch: bytes) -> int:
        return await self.published("ojs.events", batch)

    async def logged(self, after: int, most: int) -> list[tuple[int, bytes]]:
        return [(int(m.headers["Nats-Sequence"]), m.data) async for m in self.replies.answers(
            f"$JS.API.DIRECT.GET.{EVENTS}", json.dumps({"seq": after + 1, "batch": most}).encode(), ends=("204", "404"))]

    async def log_bounds(self) -> tuple[int, int]:
        state = (await self.js.stream_info(EVENTS)).state
        return (state.first_seq, state.last_seq) if state.messages else (0, 0)
