"""The job store's ready order on NATS, held as leases, and its event log. Part of
seamq.jobs.nats_store's adapter.

- Stream `OJS_READY` (work queue): an empty entry per available job, on
  `ojs.ready.{queue}.p{priority + 100:03d}.{id}` (a tenant's job: `...p{nnn}.T.{tenant}.{id}`, its
  lane; `T` is no queue's token, queues being lowercase), written before the record that makes the
  job available; one durable pull consumer per queue, priority and lane (`...p{nnn}.*`,
  `...p{nnn}.T.{tenant}.*`: they never overlap, as a work queue's consumers must not), shared by
  every server. A taken entry is held by the consumer's ack wait (30 s, ports.TAKEN_HOLD), or by a NAK
  with a delay (`hold`: a lease shorter than that, a heartbeat, what remains of a lease). JetStream
  delivers it again when the hold ends unless it is acked first (`+ACK`, from any connection, to
  the reply subject the job's record keeps). A job cancelled while it waits has its entry purged.
- The order between priorities is the store's: a queue's priorities and their lanes are a record
  (`prio.{queue}`) that every server follows, and a take pulls from the highest first; within a
  priority, from each lane in turn, a share of the count each; within a lane, JetStream's order is
  first in, first out, with entries that come again before later ones.
- Stream `OJS_EVENTS`: the events, a batch of them per message (seamq.jobs.events).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

from seamq.jobs.nats_records import RECORD_TTL_SECONDS, NatsRecords, made
from seamq.jobs.ports import TAKEN_HOLD, Conflict, Taken, Write
from seamq.observability import log
from seamq.model import describe

READY, EVENTS = "OJS_READY", "OJS_EVENTS"
LOG_KEPT = 10_000  # batches of events
EMPTY_LANE = 0.25  # seconds a tenant's lane found empty is not asked again by this server
REPLY_WAIT = 5.0  # seconds for the server's answer to a no_wait pull (it answers at once; this only bounds it)
# A ready consumer's ack wait is the hold of an entry taken (ports.TAKEN_HOLD). As long as the default
# visibility timeout (1,800 s), it left jobs unseen for half an hour when the server that pulled them
# died before claiming them (the R3 kill test: 19 of 5,000 still available at its end).


def _subject(queue: str, priority: int, job_id: str = "*", tenant: str = "") -> str:
    lane = f"T.{tenant.replace('.', '=')}." if tenant else ""  # a tenant's dots would split its token
    return f"ojs.ready.{queue}.p{priority + 100:03d}.{lane}{job_id}"


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


class NatsReadyOrder:
    def __init__(self, records: NatsRecords) -> None:
        self.records, self.nc, self.js, self.replicas = records, records.nc, records.js, records.replicas
        self._follower: asyncio.Task | None = None

    async def start(self) -> None:
        self._made: set[str] = set()  # consumers known to exist
        self._inboxes: list = []  # idle pull subscriptions, one pull at a time on each (a delivery
        # names the entry's subject, not the inbox, so one wildcard inbox cannot tell the pulls apart)
        self._priorities: dict[str, set[int]] = {}  # queue -> the priorities its jobs were offered at
        self._lanes: dict[tuple[str, int], set[str]] = {}  # (queue, priority) -> the tenants offered at it
        self._empty: dict[tuple[str, int, str], float] = {}  # a lane found empty here, until (loop time)
        self._turns = itertools.count()  # which lane a take serves first
        self._registering: dict[tuple[str, int, str], asyncio.Future] = {}
        for config in (StreamConfig(name=READY, subjects=["ojs.ready.>"], retention=RetentionPolicy.WORK_QUEUE,
                                    storage=StorageType.FILE, num_replicas=self.replicas),
                       StreamConfig(name=EVENTS, subjects=["ojs.events"], max_msgs=LOG_KEPT, max_bytes=256 * 2 ** 20,
                                    max_age=RECORD_TTL_SECONDS, allow_direct=True, storage=StorageType.FILE,
                                    num_replicas=self.replicas)):
            await made(self.js, config)
        for record, _ in await self.records.scan("prio."):
            self._known_lanes(record["_key"].removeprefix("prio."), record)
        self._follower = asyncio.create_task(self._follow_priorities())

    async def stop_following(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
            self._follower = None

    async def close(self) -> None:
        await self.stop_following()
        for inbox in self._inboxes:
            await inbox.sub.unsubscribe()
        self._inboxes.clear()

    def forget(self) -> None:
        """Every queue's priorities and lanes (the store was wiped)."""
        self._priorities.clear()

    async def offer(self, queue: str, priority: int, job_id: str, tenant: str = "") -> None:
        if priority not in self._priorities.get(queue, ()) or (tenant and tenant not in self._lanes.get((queue, priority), ())):
            # One registration for every offer waiting on it (a batch of 1,000 to a new queue made
            # 1,000, each a read and a CAS that all but one lost).
            lane = (queue, priority, tenant)
            pending = self._registering.get(lane)
            if pending is None:
                pending = self._registering[lane] = asyncio.ensure_future(self._register(*lane))
                pending.add_done_callback(lambda done: (self._registering.pop(lane, None),
                                                        done.cancelled() or done.exception()))  # heard, if late
            await asyncio.shield(pending)
        self._empty.pop((queue, priority, tenant), None)
        await self.records.published(_subject(queue, priority, job_id, tenant), b"")  # the subject names the job

    async def withdraw(self, queue: str, priority: int, job_id: str, tenant: str = "") -> None:
        await self.js.purge_stream(READY, subject=_subject(queue, priority, job_id, tenant))

    async def _register(self, queue: str, priority: int, tenant: str) -> None:
        """A queue's priorities and their tenants' lanes are a record every server follows: a take asks
        only those, highest first, with no request to find which subjects hold entries."""
        key = f"prio.{queue}"
        for _ in range(10):
            held = await self.records.get(key)
            record = dict(held.record) if held else {"_key": key, "priorities": []}
            record["priorities"] = sorted({*record["priorities"], priority})
            if tenant:
                lanes = dict(record.get("lanes") or {})
                lanes[str(priority)] = sorted({*lanes.get(str(priority), ()), tenant})
                record["lanes"] = lanes
            try:
                await self.records.commit([Write(key, record, held.revision if held else 0)])
            except Conflict:
                continue  # another server added one meanwhile
            self._known_lanes(queue, record)
            return
        raise Conflict(f"{key}: lost 10 compare-and-sets in a row to other servers")

    def _known_lanes(self, queue: str, record: dict | None) -> None:
        self._priorities[queue] = set(record["priorities"] if record else ())
        if record is None:  # wiped
            self._lanes = {lane: tenants for lane, tenants in self._lanes.items() if lane[0] != queue}
        for priority, tenants in ((record or {}).get("lanes") or {}).items():
            self._lanes[queue, int(priority)] = {*self._lanes.get((queue, int(priority)), ()), *tenants}

    async def _follow_priorities(self) -> None:
        while True:
            try:
                async for key, record in self.records.follow(["prio."]):
                    if key:
                        self._known_lanes(key.removeprefix("prio."), record)
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

    async def take(self, queue: str, count: int, tenant: str | None = None) -> list[Taken]:
        # The queue's priorities and lanes as last stored, not as the watch has told this server so far:
        # a job pushed through another server a moment ago may be at a priority, or in a lane, this one
        # has not heard of yet, and a fetch must find it (conformance, two servers, on a busy machine).
        # The read goes beside the pull of the highest priority known (one wait a fetch, not two); if it
        # shows a priority or a lane that pull did not know, what the pull took goes back at once and
        # the take starts again on what was read.
        reading = asyncio.ensure_future(self.records.get(f"prio.{queue}"))
        priorities = sorted(self._priorities.get(queue, ()), reverse=True)
        known, first = self._lanes_of(queue), []
        try:
            if priorities:
                first = await self._take_priority(queue, priorities[0], count, tenant)
            held = await reading
        except BaseException:
            reading.cancel()
            reading.add_done_callback(lambda done: done.cancelled() or done.exception())  # heard, whatever it was
            with contextlib.suppress(Exception):  # else they come again when their hold ends
                await self._give_back(first)
            raise
        if held is not None:
            before = self._priorities.get(queue, set())
            self._known_lanes(queue, held.record)
            self._priorities[queue] |= before
        pulled = priorities[0] if priorities else None
        if self._lanes_of(queue) != known:
            await self._give_back(first)
            first, pulled = [], None
        out = first
        for priority in sorted(self._priorities.get(queue, ()), reverse=True):
            if len(out) >= count:
                break
            if priority != pulled:
                out += await self._take_priority(queue, priority, count - len(out), tenant)
        return out

    def _lanes_of(self, queue: str) -> dict[int, frozenset[str]]:
        return {p: frozenset(self._lanes.get((queue, p), ())) for p in self._priorities.get(queue, ())}

    async def _take_priority(self, queue: str, priority: int, count: int, tenant: str | None) -> list[Taken]:
        known = self._lanes.get((queue, priority), set())
        lanes = ["", *sorted(known)] if tenant is None else [tenant] if not tenant or tenant in known else []
        if len(lanes) > 1:  # lanes found empty here a moment ago take no turn (an idle tenant's, or the queue's own)
            now = asyncio.get_running_loop().time()
            lanes = [lane for lane in lanes if self._empty.get((queue, priority, lane), 0) <= now]
        turn = next(self._turns) % len(lanes) if len(lanes) > 1 else 0
        return await self._take_lanes(queue, priority, lanes[turn:] + lanes[:turn], count)

    async def _give_back(self, taken: list[Taken]) -> None:
        """Entries taken and not handed out: delivered again at once, before any later one of their lane."""
        for entry in taken:
            await self.hold(entry.hold, 0)

    async def _take_lanes(self, queue: str, priority: int, lanes: list[str], count: int) -> list[Taken]:
        """Each lane in turn, a share of what is left each; a lane that had fewer leaves the rest to
        the others' second turn. A lane found empty is not asked again here for EMPTY_LANE seconds
        (unless this server offers to it), so that many tenants cost a take few pulls and an empty lane
        takes no share from the others; a queue of one lane is always asked."""
        out: list[Taken] = []
        now, pulls, several = asyncio.get_running_loop().time(), 0, len(lanes) > 1
        for _ in range(2):
            full = []
            for index, lane in enumerate(lanes):
                left = count - len(out)
                if left <= 0 or pulls >= 2 * count + 4:
                    return out
                share = -(-left // (len(lanes) - index))
                pulls += 1
                got = await self._pull_now(await self._consumer(_subject(queue, priority, tenant=lane)), share)
                out += [Taken(m.subject.rsplit(".", 1)[1], str(m.metadata.sequence.stream), m.reply,
                              m.metadata.num_delivered) for m in got]
                if not got and several:
                    self._empty[queue, priority, lane] = now + EMPTY_LANE
                if len(got) == share:
                    full.append(lane)
            lanes = full
        return out

    async def hold(self, hold: str, seconds: float) -> None:
        await self.nc.publish(hold, b'-NAK {"delay":%d}' % int(seconds * 1e9))

    async def settle(self, hold: str) -> None:
        await self.nc.publish(hold, b"+ACK")

    # ---- counts -------------------------------------------------------------------------------

    async def waiting(self, queue: str) -> dict[int, int]:
        out: dict[int, int] = {}
        for priority, info in await self._lane_infos(queue):
            if info.num_pending + info.num_ack_pending:
                out[priority] = out.get(priority, 0) + info.num_pending + info.num_ack_pending
        return out

    async def ready_counts(self, queue: str) -> tuple[int, int]:
        infos = await self._lane_infos(queue)
        return sum(info.num_pending for _, info in infos), sum(info.num_ack_pending for _, info in infos)

    async def _lane_infos(self, queue: str) -> list:
        return [(priority, await self.js.consumer_info(READY, await self._consumer(_subject(queue, priority, tenant=lane))))
                for priority in self._priorities.get(queue, ()) for lane in ("", *self._lanes.get((queue, priority), ()))]

    async def queues(self) -> list[str]:
        return sorted(self._priorities)

    # ---- the event log ------------------------------------------------------------------------

    async def log(self, batch: bytes) -> int:
        return await self.records.published("ojs.events", batch)

    async def logged(self, after: int, most: int) -> list[tuple[int, bytes]]:
        return [(int(m.headers["Nats-Sequence"]), m.data) async for m in self.records.replies.answers(
            f"$JS.API.DIRECT.GET.{EVENTS}", json.dumps({"seq": after + 1, "batch": most}).encode(), ends=("204", "404"))]

    async def log_bounds(self) -> tuple[int, int]:
        state = (await self.js.stream_info(EVENTS)).state
        return (state.first_seq, state.last_seq) if state.messages else (0, 0)
