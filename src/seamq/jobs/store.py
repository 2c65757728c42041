"""The job store on NATS: job records in KV with compare-and-set, timers as JetStream message schedules.

NATS resources (created idempotently at start):

- KV `OJS_JOBS`: the source of truth, one record per key: a job under its id,
  and `wf.{id}` (workflow), `cron.{hex name}` (cron), `queue.{name}` (a queue's
  pause flag). Every state change is a CAS on the revision the engine last saw,
  so a claim is exclusive even with several writers. Writes that belong
  together (a bulk enqueue; a chain step's ack with its workflow and the next
  step; a cron fire with the job it enqueues) are one JetStream atomic batch:
  all stored or none, each message with its own CAS.
- KV `OJS_UNIQUE`: unique-job locks, key = fingerprint, value = holder job id,
  per-message TTL = the unique period.
- Stream `OJS_TIMERS` (`allow_msg_schedules`, one message per subject): a timer
  is an `@at` schedule on `ojs.sched.{kind}.{id}`; the server publishes it to
  `ojs.fire.{kind}.{id}` when due, where a durable consumer hands it to the
  engine. A new timer for the same job and kind replaces the old one, and
  timers survive restarts of both the server and seamq.
- Stream `OJS_ENQUEUE` (work queue): jobs enqueued in a database transaction
  (seamq.jobs.enqueue), published by the relay from the outbox with the job id
  as `Nats-Msg-Id`; the durable consumer `ojs-intake` hands them to the engine.

The engine sees records as dicts and revisions as ints; no nats-py type leaves here.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from typing import AsyncIterator

from nats.aio.client import Client
from nats.js.api import (
    AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from seamq.jobs.model import decode, encode
from seamq.jobs.ports import Conflict, Write
from seamq.nats.pull import PullSource
from seamq.model import JOBS_STREAM, JOBS_SUBJECT

JOBS, UNIQUE, TIMERS, TIMER_CONSUMER = "OJS_JOBS", "OJS_UNIQUE", "OJS_TIMERS", "ojs-timers"
INTAKE_CONSUMER = "ojs-intake"
DUPLICATE_WINDOW = 3600.0  # seconds: a relay re-publishing a job (killed before it marked it) is dropped
RECORD_TTL_SECONDS = 7 * 86400  # a finished job is kept this long (KV per-message TTL)


class JobStore:
    def __init__(self, nc: Client, *, replicas: int = 1) -> None:
        self.nc, self.replicas = nc, replicas
        self.js = nc.jetstream()
        self.jobs = self.unique = None
        self._timers_sub = self._intake_sub = None

    async def start(self) -> "JobStore":
        self.jobs = await self._bucket(JOBS)
        self.unique = await self._bucket(UNIQUE)
        await self._allow_atomic(f"KV_{JOBS}")
        self.jobs = await self.js.key_value(JOBS)  # bound again: its gets are direct gets now
        config = StreamConfig(name=TIMERS, subjects=["ojs.sched.>", "ojs.fire.>"], allow_msg_schedules=True,
                              max_msgs_per_subject=1, storage=StorageType.FILE, max_age=30 * 86400,
                              num_replicas=self.replicas)
        try:
            await self.js.add_stream(config)
        except BadRequestError:
            await self.js.update_stream(config)
        await self.js.add_consumer(TIMERS, ConsumerConfig(
            durable_name=TIMER_CONSUMER, filter_subject="ojs.fire.>", ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
            deliver_policy=DeliverPolicy.ALL, max_ack_pending=10_000))
        # A standing pull: a fired timer is handed over the moment it arrives (a fetch of a batch
        # would wait for the batch or its timeout, and retries are checked 200 ms after they are due).
        self._timers_sub = await PullSource(self.nc, TIMERS, TIMER_CONSUMER, buffer=200).start()
        intake = StreamConfig(name=JOBS_STREAM, subjects=[JOBS_SUBJECT], retention=RetentionPolicy.WORK_QUEUE,
                              storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW, num_replicas=self.replicas)
        try:
            await self.js.add_stream(intake)
        except BadRequestError:
            await self.js.update_stream(intake)
        await self.js.add_consumer(JOBS_STREAM, ConsumerConfig(
            durable_name=INTAKE_CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=-1,
            deliver_policy=DeliverPolicy.ALL, max_ack_pending=1000))
        self._intake_sub = await PullSource(self.nc, JOBS_STREAM, INTAKE_CONSUMER, buffer=200).start()
        return self

    async def _bucket(self, name: str):
        try:
            return await self.js.create_key_value(KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE,
                                                                 replicas=self.replicas))
        except BadRequestError:  # it exists, with atomic batches allowed by an earlier start
            return await self.js.key_value(name)

    async def _allow_atomic(self, stream: str) -> None:
        """`create_key_value` cannot ask for atomic batches and nats-py's StreamConfig has no field
        for it: the stream is updated through the JetStream API with its own config plus the flag."""
        info = await self.js.stream_info(stream)
        config = info.config.as_dict()
        if config.get("allow_atomic") and config.get("allow_direct"):
            return
        config["allow_atomic"] = config["allow_direct"] = True  # direct: several records in one read
        reply = json.loads((await self.nc.request(f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(config).encode(),
                                                  timeout=5)).data)
        if "error" in reply:
            raise APIError.from_error(reply["error"])

    async def close(self) -> None:
        for sub in (self._timers_sub, self._intake_sub):
            if sub is not None:
                await sub.close()

    # ---- records ------------------------------------------------------------------------------

    async def commit(self, writes: list[Write]) -> list[int]:
        """Store every write or none (Conflict); the new revisions in order.

        KV's own create/update take no TTL and no batch: the same publishes, done here (the KV
        protocol is public): `Nats-Expected-Last-Subject-Sequence` is the CAS, 0 meaning "absent".
        A KV delete leaves a marker with a sequence, so a purged key is recreated with its
        marker's revision, never with 0; `create` of a purged key reads the marker first.
        """
        if not writes:
            return []
        try:
            return await self._publish(writes)
        except Conflict:
            # A create of a key that was deleted must name the delete marker's revision, not 0.
            markers = [await self._marker(w.key) if w.revision == 0 else 0 for w in writes]
            if not any(markers):
                raise
            return await self._publish([replace(w, revision=m or w.revision) for w, m in zip(writes, markers)])

    async def _publish(self, writes: list[Write]) -> list[int]:
        batch_id = uuid.uuid4().hex if len(writes) > 1 else None
        for index, write in enumerate(writes, 1):
            headers = {} if write.revision is None else {"Nats-Expected-Last-Subject-Sequence": str(write.revision)}
            if write.finished:
                headers["Nats-TTL"] = str(RECORD_TTL_SECONDS)
            if batch_id:
                headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(index)})
            subject, payload = f"$KV.{JOBS}.{write.key}", encode(write.record)
            if index < len(writes):
                await self.nc.publish(subject, payload, headers=headers)
                continue
            if batch_id:
                headers["Nats-Batch-Commit"] = "1"
            reply = json.loads((await self.nc.request(subject, payload, headers=headers, timeout=5)).data)
        error = reply.get("error")
        if error:
            if error.get("err_code") in (10071, 10164):  # wrong last sequence: a CAS lost
                raise Conflict(", ".join(w.key for w in writes))
            raise APIError.from_error(error)
        # An atomic batch is stored in order, contiguously: the commit's sequence is the last one's.
        last = reply["seq"]
        return list(range(last - len(writes) + 1, last + 1))

    async def _marker(self, key: str) -> int:
        """The revision of a deleted key's marker (0 if the key never existed)."""
        try:
            entry = await self.jobs.get(key)
        except KeyNotFoundError as exc:
            return getattr(exc, "entry", None) and exc.entry.revision or 0
        except NotFoundError:
            return 0
        return entry.revision if entry.value is None else 0

    async def get(self, key: str) -> tuple[dict, int] | None:
        try:
            entry = await self.jobs.get(key)
        except (KeyNotFoundError, NotFoundError):
            return None
        if entry.value is None:
            return None
        return decode(entry.value), entry.revision

    async def delete(self, job_id: str) -> None:
        await self.jobs.purge(job_id)

    async def all_records(self, keys: str = ">", batch: int = 1000) -> AsyncIterator[tuple[dict, int]]:
        """Every live record under `keys` with its revision: one ordered pass over the bucket's last
        values, pulled a batch at a time (a KV watch is pushed as fast as the server can, and 100k
        records queued in the client would cost more memory than the server is allowed)."""
        stream = f"KV_{JOBS}"
        sub = await self.js.pull_subscribe(f"$KV.{JOBS}.{keys}", stream=stream, config=ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE, inactive_threshold=60,
            mem_storage=True))
        info = await sub.consumer_info()
        try:
            pending = info.num_pending
            while pending:
                for message in await sub.fetch(batch, timeout=10):
                    pending = message.metadata.num_pending
                    if message.data and (message.headers or {}).get("KV-Operation") is None:
                        yield decode(message.data), message.metadata.sequence.stream
        finally:
            await sub.unsubscribe()
            await self.js.delete_consumer(stream, info.name)  # else it lingers, and a stream holds 1,000

    # ---- unique locks -------------------------------------------------------------------------

    async def lock_unique(self, fingerprint: str, job_id: str, period: float | None) -> str | None:
        """Take the lock; returns None, or the holder's job id if it is taken."""
        ttl = math.ceil(period) if period else None
        try:
            await self.unique.create(fingerprint, job_id.encode(), msg_ttl=ttl)
            return None
        except KeyWrongLastSequenceError:
            try:
                entry = await self.unique.get(fingerprint)
            except (KeyNotFoundError, NotFoundError):
                return await self.lock_unique(fingerprint, job_id, period)
            return entry.value.decode() if entry.value else None

    async def take_unique(self, fingerprint: str, job_id: str, period: float | None) -> None:
        """Give the lock to `job_id` whoever held it."""
        await self.unique.purge(fingerprint)
        await self.lock_unique(fingerprint, job_id, period)

    async def release_unique(self, fingerprint: str) -> None:
        await self.unique.purge(fingerprint)

    # ---- timers -------------------------------------------------------------------------------

    async def arm(self, kind: str, job_id: str, at: datetime, token: dict) -> None:
        stamp = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        await self.js.publish(f"ojs.sched.{kind}.{job_id}", json.dumps(token).encode(), headers={
            "Nats-Schedule": f"@at {stamp}", "Nats-Schedule-Target": f"ojs.fire.{kind}.{job_id}"})

    async def disarm(self, kind: str, job_id: str) -> None:
        try:
            await self.js.purge_stream(TIMERS, subject=f"ojs.sched.{kind}.{job_id}")
        except NotFoundError:
            pass

    async def fired(self, batch: int = 100, timeout: float = 1.0) -> list[tuple[str, str, dict, object]]:
        """(kind, job id, token, ack handle) of timers that came due."""
        messages = await self._timers_sub.fetch(batch, timeout)
        out = []
        for m in messages:
            _, _, kind, job_id = m.subject.split(".", 3)
            try:
                token = json.loads(m.data)
            except ValueError:
                token = {}
            out.append((kind, job_id, token, m))
        return out

    @staticmethod
    async def done(handle) -> None:
        await handle.ack()

    # ---- intake: jobs enqueued in a database transaction, relayed from the outbox ------------------

    async def taken_in(self, batch: int = 100, timeout: float = 1.0) -> list[tuple[bytes, object]]:
        """(push body as sent, ack handle) of relayed jobs."""
        return [(m.data, m) for m in await self._intake_sub.fetch(batch, timeout)]

    @staticmethod
    async def later(handle, delay: float) -> None:
        await handle.nak(delay=delay)

    # ---- test mode ----------------------------------------------------------------------------

    async def wipe(self) -> None:
        """Empty every OJS bucket and stream (`POST /ojs/v1/admin/reset`)."""
        for stream in (f"KV_{JOBS}", f"KV_{UNIQUE}", TIMERS, JOBS_STREAM):
            await self.js.purge_stream(stream)

