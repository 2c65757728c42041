"""The job store's records on NATS: KV `OJS_JOBS` read and written by compare-and-set, and the
unique-job locks in KV `OJS_UNIQUE`. Part of seamq.jobs.nats_store's adapter.

One record per key: a job under its id, and `wf.{id}`, `cron.{hex name}`, `queue.{name}` and the
other flags every server follows. Writes that belong together (a bulk enqueue; a step's end with
its workflow; a cron fire with the job it enqueues) are one JetStream atomic batch: all stored or
none, each with its own CAS. KV's own create/update take neither a TTL nor a batch, so the same
publishes are made here (the KV protocol is public): `Nats-Expected-Last-Subject-Sequence` is the
CAS, 0 meaning absent. The engine sees records as dicts and revisions as ints (ports.Stored).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import uuid
from dataclasses import replace
from typing import AsyncIterator

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from seamq.jobs.model import decode, encode, utcnow
from seamq.jobs.ports import Conflict, Stored, Write
from seamq.jobs.tally import RETENTION, ttl
from seamq.nats.replies import Replies, acked
from seamq.nats.wire import header_block

JOBS, UNIQUE = "OJS_JOBS", "OJS_UNIQUE"
RECORD_TTL_SECONDS = int(RETENTION.total_seconds())  # a finished record that is not a job's (KV per-message TTL)
MULTI_GET = 1000  # keys in one batched direct get (nats-server 2.15 refuses more than 1,024: measured)
CAS_LOST = (10071, 10164)  # JetStream's "wrong last sequence": a compare-and-set lost
WATCH_KEPT = 30  # seconds a watch's consumer outlives a server killed -9 (nats-py's default: 5 minutes)
BATCH_WAIT = 0.01  # seconds more, per write, that an atomic batch may take to be acked


async def _nothing_sent(watcher) -> bool:
    """nats-py marks a watch's start (None) when its consumer has nothing pending and the client has
    read nothing yet, but a delivery the server has counted may still be on its way then (CI once
    saw the marker before a key that was there): the server's own counts, read together, decide."""
    info = await watcher._sub.consumer_info()
    return info.num_pending == 0 and info.delivered.consumer_seq == 0


def _stored(writes: list[Write], answer: Msg) -> list[int]:
    """The revisions of writes published together, from the answer to the last; a lost CAS is a Conflict."""
    reply = acked(answer)
    error = reply.get("error")
    if error:
        if error.get("err_code") in CAS_LOST:
            raise Conflict(", ".join(w.key for w in writes))
        raise APIError.from_error(error)
    last = reply["seq"]  # an atomic batch is stored in order, contiguously: the commit's is the last
    return list(range(last - len(writes) + 1, last + 1))


async def made(js: JetStreamContext, config: StreamConfig) -> None:
    """A stream made, or updated to `config` if it exists (each part of the store makes its own)."""
    try:
        await js.add_stream(config)
    except BadRequestError:  # it exists: as configured now
        await js.update_stream(config)


class NatsRecords:
    def __init__(self, nc: Client, replies: Replies, replicas: int) -> None:
        self.nc, self.js, self.replies, self.replicas = nc, nc.jetstream(), replies, replicas

    async def start(self) -> None:
        self.jobs = await self._bucket(JOBS)
        self.unique = await self._bucket(UNIQUE)
        await self._allow_atomic(f"KV_{JOBS}")

    async def _bucket(self, name: str):
        try:
            return await self.js.create_key_value(KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE,
                                                                 replicas=self.replicas))
        except BadRequestError:  # it exists, with atomic batches allowed by an earlier start
            return await self.js.key_value(name)

    async def _allow_atomic(self, stream: str) -> None:
        """`create_key_value` cannot ask for atomic batches and nats-py's StreamConfig has no field
        for it: the stream is updated through the JetStream API with its own config plus the flag."""
        config = (await self.js.stream_info(stream)).config.as_dict()
        if config.get("allow_atomic") and config.get("allow_direct"):
            return
        config["allow_atomic"] = config["allow_direct"] = True  # direct: several records in one read
        reply = json.loads((await self.nc.request(f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(config).encode(),
                                                  timeout=5)).data)
        if "error" in reply:
            raise APIError.from_error(reply["error"])

    async def published(self, subject: str, payload: bytes, headers: bytes = b"") -> int:
        """Publish to a stream and wait for its ack: the stored sequence."""
        ack = acked(await self.replies.request(subject, payload, headers))
        if "error" in ack:
            raise APIError.from_error(ack["error"])
        return ack["seq"]

    # ---- read and write -----------------------------------------------------------------------

    async def commit(self, writes: list[Write]) -> list[int]:
        """Store every write or none (Conflict); the new revisions in order. A KV delete leaves a
        marker with a sequence, so a purged key is recreated with its marker's revision, never 0."""
        if not writes:
            return []
        try:
            return await self._publish(writes)
        except Conflict:
            markers = [await self._marker(w.key) if w.revision == 0 else 0 for w in writes]
            if not any(markers):
                raise
            return await self._publish([replace(w, revision=m or w.revision) for w, m in zip(writes, markers)])

    async def commit_each(self, commits: list[list[Write]]) -> list[list[int] | BaseException]:
        """Several commits, each all or nothing on its own, sent together and awaited together (a
        fetch's claims: no task each); the outcome of each, its revisions or its error."""
        sent: list[asyncio.Future] = []
        for writes in commits:
            if len(writes) == 1 and writes[0].revision != 0:  # a key to create may meet a delete's marker
                sent.append(await self._sent(writes))
            else:
                sent.append(asyncio.ensure_future(self.commit(writes)))
        outcomes: list[list[int] | BaseException] = []
        for writes, answer in zip(commits, await asyncio.gather(*sent, return_exceptions=True)):
            try:
                outcomes.append(_stored(writes, answer) if isinstance(answer, Msg) else answer)
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    async def _publish(self, writes: list[Write]) -> list[int]:
        return _stored(writes, await (await self._sent(writes)))

    async def _sent(self, writes: list[Write]) -> asyncio.Future:
        """The writes published, the last asking for the answer: its future."""
        batch_id = uuid.uuid4().hex if len(writes) > 1 else None
        for index, write in enumerate(writes, 1):
            headers = {} if write.revision is None else {"Nats-Expected-Last-Subject-Sequence": str(write.revision)}
            if write.record is None:
                headers["KV-Operation"] = "DEL"
            elif write.finished:  # a job's record, until its count ends (seamq.jobs.tally)
                headers["Nats-TTL"] = str(ttl(write.key, write.record, utcnow()))
            if batch_id:
                headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(index)})
            subject, payload = f"$KV.{JOBS}.{write.key}", b"" if write.record is None else encode(write.record)
            if index < len(writes):
                await self.replies.wire.publish(subject, payload, headers=header_block(headers))
                continue
            if batch_id:
                headers["Nats-Batch-Commit"] = "1"
            # NATS stores a batch whole, so a bigger one may take longer before its ack.
            return await self.replies.sent(subject, payload, header_block(headers),
                                           timeout=self.replies.timeout + BATCH_WAIT * len(writes))
        raise AssertionError("no writes")

    async def _marker(self, key: str) -> int:
        """The revision of a deleted key's marker (0 if the key never existed or holds a record)."""
        last = await self._last(key)
        return last[1] if last and last[0] is None else 0

    async def get(self, key: str) -> Stored | None:
        last = await self._last(key)
        return Stored(decode(last[0]), last[1]) if last and last[0] is not None else None

    async def _last(self, key: str) -> tuple[bytes | None, int] | None:
        """The key's last message as last stored, asked of the stream's leader (`STREAM.MSG.GET`):
        (its record, None for a delete marker; its revision), or None. A direct get, which KV uses,
        may be answered by a replica that has not yet applied the last writes, and a refusal or a
        dropped entry decided on such a read loses a job (found by the R3 kill test)."""
        answer = json.loads((await self.replies.request(f"$JS.API.STREAM.MSG.GET.KV_{JOBS}", json.dumps(
            {"last_by_subj": f"$KV.{JOBS}.{key}"}).encode())).data)
        if "error" in answer:
            if answer["error"].get("code") == 404:
                return None
            raise APIError.from_error(answer["error"])
        message = answer["message"]
        marker = not message.get("data") or b"KV-Operation" in base64.b64decode(message.get("hdrs") or "")
        return None if marker else base64.b64decode(message["data"]), message["seq"]

    async def get_many(self, keys: list[str]) -> dict[str, Stored]:
        """Batched direct gets of the keys' last records (nats-server 2.11+), each answered as a run
        of messages ended by a status; at most MULTI_GET keys a request (more are refused). Any
        replica may answer, so a record may be older than the last one stored: the port says so."""
        out: dict[str, Stored] = {}
        for start in range(0, len(keys), MULTI_GET):
            subjects = [f"$KV.{JOBS}.{key}" for key in keys[start:start + MULTI_GET]]
            async for message in self.replies.answers(f"$JS.API.DIRECT.GET.KV_{JOBS}", json.dumps(
                    {"multi_last": subjects, "batch": len(subjects)}).encode(), ends=("204", "404")):  # 404: none
                headers = message.headers or {}
                if message.data and not headers.get("KV-Operation"):
                    out[headers["Nats-Subject"].removeprefix(f"$KV.{JOBS}.")] = Stored(
                        decode(message.data), int(headers["Nats-Sequence"]))
        return out

    async def delete(self, key: str) -> None:
        await self.jobs.purge(key)

    async def scan(self, prefix: str, batch: int = 1000) -> list[Stored]:
        """One ordered pass over the bucket's last values, pulled a batch at a time (a KV watch is
        pushed as fast as the server can, and 100k records queued in the client would cost more
        memory than the server is allowed)."""
        stream, out = f"KV_{JOBS}", []
        sub = await self.js.pull_subscribe(f"$KV.{JOBS}.{prefix}>" if prefix else f"$KV.{JOBS}.*", stream=stream,
                                           config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                                                                 ack_policy=AckPolicy.NONE, inactive_threshold=60,
                                                                 mem_storage=True))
        info = await sub.consumer_info()
        try:
            pending = info.num_pending
            while pending:
                for message in await sub.fetch(batch, timeout=10):
                    pending = message.metadata.num_pending
                    if message.data and (message.headers or {}).get("KV-Operation") is None:
                        out.append(Stored(decode(message.data), message.metadata.sequence.stream))
        finally:
            await sub.unsubscribe()
            await self.js.delete_consumer(stream, info.name)  # else it lingers, and a stream holds 1,000
        return out

    async def follow(self, prefixes: list[str]) -> AsyncIterator[tuple[str, dict | None]]:
        """A KV watch per prefix; a watch that fails or ends is raised to the follower, who follows
        again from the start: no change may go unheard."""
        changes: asyncio.Queue = asyncio.Queue()

        async def watch(prefix: str) -> None:
            watcher = None
            try:
                watcher = await self.jobs.watch(f"{prefix}>", inactive_threshold=WATCH_KEPT)
                started = False
                async for entry in watcher:
                    if entry is not None:
                        changes.put_nowait((entry.key, decode(entry.value) if entry.value and not entry.operation
                                            else None))
                    if not started and (entry.delta == 0 if entry is not None else await _nothing_sent(watcher)):
                        started = True  # what was there at the start has all come
                        changes.put_nowait(("", prefix))
                raise ConnectionError(f"the watch of {prefix}> ended")
            except Exception as exc:
                changes.put_nowait((None, exc))
            finally:  # no one listens: its consumer goes now, or WATCH_KEPT later if NATS is away
                if watcher is not None:  # (a stream holds 1,000, and servers restart)
                    with contextlib.suppress(Exception):
                        await watcher.stop()
                        sub = watcher._sub  # nats-py's stop leaves the consumer to its inactive threshold
                        await self.js.delete_consumer(sub._stream, sub._consumer)

        tasks = [asyncio.create_task(watch(prefix)) for prefix in prefixes]
        started = set()
        try:
            while True:
                key, record = await changes.get()
                if key is None:
                    raise record
                if key:
                    yield key, record
                    continue
                started.add(record)
                if len(started) == len(prefixes):
                    yield "", None
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # each takes its consumer along

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
