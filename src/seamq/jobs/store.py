"""The job store on NATS: job records in KV with compare-and-set, timers as JetStream message schedules.

NATS resources (created idempotently at start):

- KV `OJS_JOBS`: one record per job id, the source of truth; every state change
  is a CAS on the revision the engine last saw, so a claim is exclusive even
  with several writers.
- KV `OJS_UNIQUE`: unique-job locks, key = fingerprint, value = holder job id,
  per-message TTL = the unique period.
- Stream `OJS_TIMERS` (`allow_msg_schedules`, one message per subject): a timer
  is an `@at` schedule on `ojs.sched.{kind}.{id}`; the server publishes it to
  `ojs.fire.{kind}.{id}` when due, where a durable consumer hands it to the
  engine. A new timer for the same job and kind replaces the old one, and
  timers survive restarts of both the server and seamq.

The engine sees records as dicts and revisions as ints; no nats-py type leaves here.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import AsyncIterator

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NotFoundError

from seamq.nats.pull import PullSource

JOBS, UNIQUE, TIMERS, TIMER_CONSUMER = "OJS_JOBS", "OJS_UNIQUE", "OJS_TIMERS", "ojs-timers"
RECORD_TTL_SECONDS = 7 * 86400  # a finished job is kept this long (KV per-message TTL)


class Conflict(Exception):
    """A CAS lost: someone else changed the record (or created the key) first."""


class JobStore:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.jobs = self.unique = None
        self._timers_sub = None

    async def start(self) -> "JobStore":
        self.jobs = await self.js.create_key_value(KeyValueConfig(bucket=JOBS, history=1, storage=StorageType.FILE))
        self.unique = await self.js.create_key_value(
            KeyValueConfig(bucket=UNIQUE, history=1, storage=StorageType.FILE))
        config = StreamConfig(name=TIMERS, subjects=["ojs.sched.>", "ojs.fire.>"], allow_msg_schedules=True,
                              max_msgs_per_subject=1, storage=StorageType.FILE, max_age=30 * 86400)
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
        return self

    # ---- records ------------------------------------------------------------------------------

    async def create(self, record: dict, *, ttl: float | None = None) -> int:
        try:
            return await self.jobs.create(record["id"], _encode(record), msg_ttl=ttl)
        except KeyWrongLastSequenceError:
            raise Conflict(record["id"]) from None

    async def get(self, job_id: str) -> tuple[dict, int] | None:
        try:
            entry = await self.jobs.get(job_id)
        except (KeyNotFoundError, NotFoundError):
            return None
        if entry.value is None:
            return None
        return json.loads(entry.value), entry.revision

    async def update(self, record: dict, revision: int, *, finished: bool = False) -> int:
        """CAS: the new revision, or Conflict. A finished job's record expires after RECORD_TTL_SECONDS."""
        # KeyValue.update() takes no TTL: the same CAS publish, done here (the KV protocol is public).
        try:
            ack = await self.js.publish(f"$KV.{JOBS}.{record['id']}", _encode(record),
                                        headers={"Nats-Expected-Last-Subject-Sequence": str(revision)},
                                        msg_ttl=RECORD_TTL_SECONDS if finished else None)
        except APIError as exc:
            if exc.err_code in (10071, 10164):  # wrong last sequence: the CAS lost
                raise Conflict(record["id"]) from None
            raise
        return ack.seq

    async def delete(self, job_id: str) -> None:
        await self.jobs.purge(job_id)

    async def all_records(self) -> AsyncIterator[tuple[dict, int]]:
        try:
            keys = await self.jobs.keys()
        except (NoKeysError, NotFoundError):
            return
        for key in keys:
            found = await self.get(key)
            if found:
                yield found

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

    # ---- test mode ----------------------------------------------------------------------------

    async def wipe(self) -> None:
        """Empty every OJS bucket and stream (`POST /ojs/v1/admin/reset`)."""
        for stream in (f"KV_{JOBS}", f"KV_{UNIQUE}", TIMERS):
            await self.js.purge_stream(stream)


def _encode(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()
