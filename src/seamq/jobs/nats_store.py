"""The job store port on NATS: records and timers as seamq.jobs.store keeps them, the ready order as a
JetStream work-queue stream held as leases, and the log of finished jobs.

- Stream `OJS_READY` (work queue): an empty entry per available job, on
  `ojs.ready.{queue}.p{priority + 100:03d}.{id}`, written before the record that makes the job
  available; one durable pull consumer per queue and priority (`...p{nnn}.*`), shared by every
  server. Taking an entry NAKs it at once with a delay: that is the hold, and JetStream delivers it
  again after the delay unless it is acked first (`+ACK`, from any connection, to the reply subject
  the job's record keeps). A heartbeat is another NAK with a delay. A job cancelled while it waits
  has its entry purged by its subject.
- The order between priorities is the store's: a queue's priorities are a record (`prio.{queue}`)
  that every server follows, and a take pulls from the highest first; within a priority,
  JetStream's order is first in, first out, with entries that come again before later ones.
- Stream `OJS_DONE`: an empty message per finished job on `ojs.done.{queue}.{state}`, kept for the
  records' retention; the counts of finished jobs are its subject counts.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import AsyncIterator

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from seamq.jobs import store as v1
from seamq.jobs.model import decode
from seamq.jobs.ports import Conflict, Fired, Taken, Write
from seamq.nats.provision import cluster_size
from seamq.observability import log

READY, DONE = "OJS_READY", "OJS_DONE"
FOLLOWED = ("queue.", "system.", "limit.", "schema.", "cron.", "prio.")  # wiped with delete markers
REPLY_WAIT = 5.0  # seconds for the server's answer to a no_wait pull (it answers at once; this only bounds it)


def _subject(queue: str, priority: int, job_id: str = "*") -> str:
    return f"ojs.ready.{queue}.p{priority + 100:03d}.{job_id}"


class NatsJobStore:
    def __init__(self, nc: Client, *, replicas: int | None = None, timer_ack_wait: float = 30) -> None:
        """`replicas`: copies of each stream in a cluster; by default 3 in a cluster of 3 or more, else 1."""
        self.nc, self.js = nc, nc.jetstream()
        size = cluster_size(self.js) or 1
        self.replicas = replicas or (3 if size >= 3 else 1)
        self.v1 = v1.JobStore(nc, replicas=self.replicas)
        self.timer_ack_wait = timer_ack_wait
        self._made: set[str] = set()  # consumers known to exist
        self._inboxes: list = []  # idle reply subscriptions, one pull at a time on each
        self._priorities: dict[str, set[int]] = {}  # queue -> the priorities its jobs were offered at
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> "NatsJobStore":
        await self.v1.start()
        r = self.replicas
        for config in (StreamConfig(name=READY, subjects=["ojs.ready.>"], retention=RetentionPolicy.WORK_QUEUE,
                                    storage=StorageType.FILE, num_replicas=r),
                       StreamConfig(name=DONE, subjects=["ojs.done.>"], max_age=v1.RECORD_TTL_SECONDS,
                                    storage=StorageType.FILE, num_replicas=r)):
            try:
                await self.js.add_stream(config)
            except BadRequestError:
                await self.js.update_stream(config)
        for key, record in [(r["_key"], r) for r, _ in await self.scan("prio.")]:
            self._priorities[key.removeprefix("prio.")] = set(record["priorities"])
        self._tasks.append(asyncio.create_task(self._follow_priorities()))
        return self

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, sub in self._inboxes:
            await sub.unsubscribe()
        await self.v1.close()

    # ---- records: seamq.jobs.store's ----------------------------------------------------------------

    async def get(self, key: str) -> tuple[dict, int] | None:
        return await self.v1.get(key)

    async def commit(self, writes: list[Write]) -> list[int]:
        return await self.v1.commit(writes)

    async def delete(self, key: str) -> None:
        await self.v1.delete(key)

    async def get_many(self, keys: list[str]) -> dict[str, tuple[dict, int]]:
        """One batched direct get of the keys' last records (nats-server 2.11+), answered as a stream
        of messages ended by a status."""
        if len(keys) < 2:
            return {k: held for k in keys if (held := await self.get(k)) is not None}
        # An inbox of its own, never the pulls' pooled ones: a late answer to one would be taken by the
        # other for what it asked (a pull reading a record as an entry failed its fetch, found so).
        inbox, sub = await self._new_inbox()
        subjects = [f"$KV.{v1.JOBS}.{key}" for key in keys]
        out: dict[str, tuple[dict, int]] = {}
        try:
            await self.nc.publish(f"$JS.API.DIRECT.GET.KV_{v1.JOBS}", json.dumps(
                {"multi_last": subjects, "batch": len(subjects)}).encode(), reply=inbox)
            while True:
                message = await sub.next_msg(timeout=REPLY_WAIT)
                headers = message.headers or {}
                if headers.get("Status"):  # 204: the end; 404: none of them
                    break
                if message.data and not headers.get("KV-Operation"):
                    out[headers["Nats-Subject"].removeprefix(f"$KV.{v1.JOBS}.")] = (
                        decode(message.data), int(headers["Nats-Sequence"]))
            return out
        finally:
            await sub.unsubscribe()

    async def scan(self, prefix: str) -> list[tuple[dict, int]]:
        return [held async for held in self.v1.all_records(f"{prefix}>" if prefix else "*")]

    async def follow(self, prefixes: list[str]) -> AsyncIterator[tuple[str, dict | None]]:
        changes: asyncio.Queue = asyncio.Queue()

        async def watch(prefix: str) -> None:
            async for entry in await self.v1.jobs.watch(f"{prefix}>"):
                if entry is None:  # what was there at the start has all come
                    changes.put_nowait(("", prefix))
                else:
                    changes.put_nowait((entry.key, decode(entry.value) if entry.value and not entry.operation
                                        else None))

        tasks = [asyncio.create_task(watch(prefix)) for prefix in prefixes]
        started = set()
        try:
            while True:
                key, record = await changes.get()
                if key:
                    yield key, record
                    continue
                started.add(record)
                if len(started) == len(prefixes):
                    yield "", None
        finally:
            for task in tasks:
                task.cancel()

    # ---- the ready order ----------------------------------------------------------------------------

    async def offer(self, queue: str, priority: int, job_id: str) -> None:
        if priority not in self._priorities.get(queue, ()):
            await self._register(queue, priority)
        await self.js.publish(_subject(queue, priority, job_id), b"")  # the subject names the job

    async def withdraw(self, queue: str, priority: int, job_id: str) -> None:
        await self.js.purge_stream(READY, subject=_subject(queue, priority, job_id))

    async def _register(self, queue: str, priority: int) -> None:
        """A queue's priorities are a record every server follows: a take asks only those, highest
        first, with no request to find which subjects hold entries."""
        key = f"prio.{queue}"
        for _ in range(10):
            held = await self.v1.get(key)
            known = {*(held[0]["priorities"] if held else ()), priority}
            try:
                await self.v1.commit([Write(key, {"_key": key, "priorities": sorted(known)}, held[1] if held else 0)])
            except Conflict:
                continue  # another server added one meanwhile
            self._priorities[queue] = known
            return

    async def _follow_priorities(self) -> None:
        while True:
            try:
                async for key, record in self.follow(["prio."]):
                    if key:
                        self._priorities[key.removeprefix("prio.")] = set(record["priorities"] if record else ())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the client reconnects
                log.warning("ojs_follow_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5)

    async def _consumer(self, subject: str) -> str:
        durable = "ready-" + subject.removeprefix("ojs.ready.").removesuffix(".*").encode().hex()
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
                if message.reply and message.reply.startswith("$JS.ACK."):  # else a stray, not an entry
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
        out = {}
        for priority in self._priorities.get(queue, ()):
            info = await self.js.consumer_info(READY, await self._consumer(_subject(queue, priority)))
            if info.num_pending + info.num_ack_pending:
                out[priority] = info.num_pending + info.num_ack_pending
        return out

    async def take(self, queue: str, count: int, hold_seconds: float) -> list[Taken]:
        out: list[Taken] = []
        for priority in sorted(self._priorities.get(queue, ()), reverse=True):
            if len(out) >= count:
                break
            durable = await self._consumer(_subject(queue, priority))
            messages = await self._pull_now(durable, count - len(out))
            for m in messages:
                await self._nak(m.reply, hold_seconds)  # the hold
                out.append(Taken(m.subject.rsplit(".", 1)[1], str(m.metadata.sequence.stream), m.reply,
                                 m.metadata.num_delivered))
        return out

    async def queues(self) -> list[str]:
        await self.nc.flush()
        done = await self.js.stream_info(DONE, subjects_filter="ojs.done.>")
        return sorted({*self._priorities, *(s.removeprefix("ojs.done.").rsplit(".", 1)[0]
                                            for s in done.state.subjects or {})})

    async def ready_counts(self, queue: str) -> tuple[int, int]:
        waiting, held = 0, 0
        for priority in self._priorities.get(queue, ()):
            info = await self.js.consumer_info(READY, await self._consumer(_subject(queue, priority)))
            waiting += info.num_pending
            held += info.num_ack_pending
        return waiting, held

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
        return [Fired(kind, key, token, handle, handle.metadata.num_delivered)
                for kind, key, token, handle in await self.v1.fired(batch, timeout)]

    async def done(self, fired: Fired) -> None:
        await self.v1.done(fired.handle)

    async def again(self, fired: Fired, seconds: float) -> None:
        await fired.handle.nak(delay=seconds)

    async def armed(self, kind: str, queue: str) -> int:
        """A consumer made for the count and dropped: its pending count is the number of timers."""
        info = await self.js.add_consumer(v1.TIMERS, ConsumerConfig(
            filter_subject=f"ojs.sched.{kind}.{queue}.*", ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=10, mem_storage=True))
        try:
            return info.num_pending
        finally:
            await self.js.delete_consumer(v1.TIMERS, info.name)

    # ---- events and finished jobs --------------------------------------------------------------------

    async def finished(self, queue: str, state: str) -> None:
        await self.nc.publish(f"ojs.done.{queue}.{state}", b"")

    async def tally(self, queue: str) -> dict[str, int]:
        await self.nc.flush()
        info = await self.js.stream_info(DONE, subjects_filter=f"ojs.done.{queue}.*")
        return {s.rsplit(".", 1)[1]: n for s, n in (info.state.subjects or {}).items()}

    # ---- intake: jobs enqueued in a database transaction (seamq.jobs.intake) -----------------------------

    async def taken_in(self, batch: int = 100, timeout: float = 1.0) -> list[tuple[bytes, object]]:
        return await self.v1.taken_in(batch, timeout)

    async def later(self, handle, delay: float) -> None:
        await self.v1.later(handle, delay)

    async def intake_done(self, handle) -> None:
        await handle.ack()

    # ---- unique locks, test mode: seamq.jobs.store's ----------------------------------------------------

    async def lock_unique(self, fingerprint: str, job_id: str, period: float | None) -> str | None:
        return await self.v1.lock_unique(fingerprint, job_id, period)

    async def take_unique(self, fingerprint: str, job_id: str, period: float | None) -> None:
        await self.v1.take_unique(fingerprint, job_id, period)

    async def wipe(self) -> None:
        for key in [r["_key"] for prefix in FOLLOWED for r, _ in await self.scan(prefix) if "_key" in r]:
            await self.v1.jobs.delete(key)  # each server following it hears that it is gone
        await self.v1.wipe()
        self._priorities.clear()
        for stream in (READY, DONE):
            await self.js.purge_stream(stream)
