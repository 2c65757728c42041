"""The OJS engine: job operations and the clocks that move jobs on their own.

The records live in NATS KV (seamq.jobs.store) and every transition is a CAS
on the revision last seen, so a job is claimed once however many fetches race
for it. What a record cannot answer quickly is kept here, rebuilt from KV at
start: per queue a heap of available jobs by (priority, FIFO), leases of active
jobs, recent events. One engine serves a set of buckets at a time (ADR-013a in
docs/jobs.md).

Clocks: scheduled jobs, retry backoff and expiry are JetStream `@at` schedules,
so they survive restarts of either process, and also deadlines in a heap here,
for precision: measured on nats-server 2.15, a schedule armed after a stream
purge fired 250 ms late and one armed earlier than a pending one 50 ms late,
while the suite checks retries 200 ms after they are due. Whichever fires
first moves the job; the other then finds nothing to do. Leases and
`timeout_ms` are heap deadlines only, re-armed from the records at start. A
timer carries the job's attempt and the engine's generation (new at each reset
and start), so one that no longer applies changes nothing.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections import deque
from datetime import datetime, timedelta
from typing import Any

from seamq.jobs import model
from seamq.jobs.model import (
    ACTIVE, AVAILABLE, CANCELLED, COMPLETED, DISCARDED, RETRYABLE, SCHEDULED, TERMINAL, OjsError, conflict, iso,
    not_found, public, utcnow,
)
from seamq.jobs.store import Conflict, JobStore
from seamq.observability import log

EVENTS_KEPT = 10_000


class Engine:
    def __init__(self, store: JobStore, *, test_mode: bool = False, rng: random.Random | None = None) -> None:
        self.store = store
        self.test_mode = test_mode
        self.rng = rng or random.Random()
        self._reset_memory()
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()

    def _reset_memory(self) -> None:
        self.jobs: dict[str, tuple[dict, int]] = {}  # id -> (record, revision)
        self.ready: dict[str, list[tuple[int, int, str]]] = {}  # queue -> heap of (-priority, seq, id)
        self.deadlines: list[tuple[float, str, str, int]] = []  # (epoch s, kind, id, attempt)
        self.events: deque[dict] = deque(maxlen=EVENTS_KEPT)
        self.event_seq = 0
        # Timers carry the generation they were armed in: a reset (and a restart, which re-arms
        # every timer from the records) starts a new one, so no earlier timer changes anything.
        self.gen = self.rng.getrandbits(62)

    async def start(self) -> "Engine":
        async for record, revision in self.store.all_records():
            await self._recover(record, revision)
        self._tasks = [asyncio.create_task(self._timer_loop()), asyncio.create_task(self._deadline_loop())]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _recover(self, record: dict, revision: int) -> None:
        """After a restart: index what waits, re-arm what is timed (a due timer fires at once)."""
        self.jobs[record["id"]] = (record, revision)
        state = record["state"]
        if state == AVAILABLE:
            self._enqueue(record, revision)
        elif state == SCHEDULED:
            await self._arm_run(record, model.parse_time(record["scheduled_at"]))
        elif state == RETRYABLE:
            await self._arm_run(record, model.parse_time(record["next_attempt_at"]))
        elif state == ACTIVE:
            self._arm_deadlines(record)
        if state in (SCHEDULED, AVAILABLE, RETRYABLE) and record.get("expires_at"):
            await self._arm_expiry(record)

    # ---- push -----------------------------------------------------------------------------------

    async def push(self, body: Any) -> tuple[int, dict]:
        record = model.new_record(body, utcnow())
        existing = await self._unique(record)
        if existing is not None:
            return 200, public(existing)
        try:
            revision = await self.store.create(record)
        except Conflict:
            raise OjsError(409, "duplicate", f"a job with id {record['id']} already exists",
                           details={"existing_job_id": record["id"]}) from None
        await self._admitted(record, revision)
        return 201, public(record)

    async def _admitted(self, record: dict, revision: int) -> None:
        self.jobs[record["id"]] = (record, revision)
        if record["state"] == AVAILABLE:
            self._enqueue(record, revision)
        else:
            await self._arm_run(record, model.parse_time(record["scheduled_at"]))
        if record.get("expires_at"):
            await self._arm_expiry(record)
        self._event("job.enqueued", record)

    async def _unique(self, record: dict) -> dict | None:
        """Apply options.unique: None to go on, or the existing job (on_conflict: ignore)."""
        unique = record.get("unique")
        if not unique:
            return None
        fingerprint = model.fingerprint(record)
        period = model.parse_duration(unique["period"]) if unique.get("period") else None
        holder_id = await self.store.lock_unique(fingerprint, record["id"], period)
        if holder_id is None:
            return None
        holder = self.jobs.get(holder_id)
        states = unique.get("states") or [s for s in model.STATES if s not in TERMINAL]
        if holder is None or holder[0]["state"] not in states:
            await self.store.take_unique(fingerprint, record["id"], period)
            return None
        policy = unique.get("on_conflict", "reject")
        if policy == "ignore":
            return holder[0]
        if policy == "replace":
            await self.cancel(holder_id)
            await self.store.take_unique(fingerprint, record["id"], period)
            return None
        raise OjsError(409, "duplicate", f"a unique job already exists: {holder_id}",
                       details={"existing_job_id": holder_id})

    # ---- fetch, ack, nack -------------------------------------------------------------------------

    async def fetch(self, queues: Any, count: Any = 1, worker_id: Any = None, visibility: Any = None) -> list[dict]:
        if not isinstance(queues, list) or not queues or not all(isinstance(q, str) for q in queues):
            raise model.invalid("queues must be a non-empty list of queue names")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= model.MAX_BATCH:
            raise model.invalid(f"count must be an integer from 1 to {model.MAX_BATCH}")
        out: list[dict] = []
        for queue in queues:
            heap = self.ready.get(queue)
            while heap and len(out) < count:
                _, seq, job_id = heapq.heappop(heap)
                claimed = await self._claim(job_id, seq, worker_id, visibility)
                if claimed is not None:
                    out.append(public(claimed))
            if len(out) >= count:
                break
        return out

    async def _claim(self, job_id: str, seq: int, worker_id: Any, visibility: Any) -> dict | None:
        held = self.jobs.get(job_id)
        if held is None or held[0]["state"] != AVAILABLE or held[0].get("_seq") != seq:
            return None  # a stale heap entry
        record, revision = held
        now = utcnow()
        if record.get("expires_at") and model.parse_time(record["expires_at"]) <= now:
            await self._expire(job_id)
            return None
        lease = now + timedelta(milliseconds=model.visibility_ms(record, visibility))
        claimed = {**record, "state": ACTIVE, "attempt": record["attempt"] + 1, "started_at": iso(now),
                   "worker_id": worker_id if isinstance(worker_id, str) else None, "_lease_until": iso(lease)}
        if not await self._write(claimed, revision):
            return None
        self._arm_deadlines(claimed)
        self._event("job.started", claimed)
        return claimed

    async def ack(self, job_id: Any, result: Any = None) -> dict:
        record, revision = self._active(job_id, "acknowledge")
        now = utcnow()
        done = {**record, "state": COMPLETED, "completed_at": iso(now), "result": result, "error": None,
                "_lease_until": None}
        if not await self._write(done, revision, finished=True):
            raise conflict(f"job {job_id} changed while it was acknowledged")
        started = model.parse_time(record["started_at"])
        self._event("job.completed", done, duration_ms=round((now - started).total_seconds() * 1000),
                    result=result)
        return {"acknowledged": True, "id": job_id, "job_id": job_id, "state": COMPLETED,
                "completed_at": done["completed_at"], "job": public(done)}

    async def nack(self, job_id: Any, error: Any = None, requeue: Any = False) -> dict:
        record, revision = self._active(job_id, "fail")
        failed = await self._fail(record, revision, error, requeue=requeue is True)
        answer = {"id": job_id, "job_id": job_id, "state": failed["state"], "attempt": failed["attempt"],
                  "max_attempts": failed["max_attempts"], "job": public(failed)}
        for key in ("retry_delay_ms", "next_attempt_at", "discarded_at", "completed_at"):
            if failed.get(key) is not None and (key not in ("retry_delay_ms", "next_attempt_at")
                                                or failed["state"] == RETRYABLE):
                answer[key] = failed[key]
        return answer

    async def _fail(self, record: dict, revision: int, error: Any, *, requeue: bool = False) -> dict:
        now = utcnow()
        outcome = model.fail(record, error, now, requeue=requeue, rng=self.rng)
        failed = {**record, **outcome.fields, "state": outcome.state, "_dlq": outcome.dead_letter or None}
        if not await self._write(failed, revision, finished=outcome.state in TERMINAL):
            raise conflict(f"job {record['id']} changed while it was failed")
        if outcome.state == RETRYABLE:
            await self._arm_run(failed, now + timedelta(seconds=outcome.retry_delay))
            self._event("job.retrying", failed)
        elif outcome.state == AVAILABLE:
            self._enqueue(failed, self.jobs[failed["id"]][1])
        else:
            self._event("job.discarded", failed)
        return failed

    def _active(self, job_id: Any, what: str) -> tuple[dict, int]:
        if not isinstance(job_id, str) or not job_id:
            raise model.invalid("job_id is required")
        held = self.jobs.get(job_id)
        if held is None:
            raise not_found(job_id)
        if held[0]["state"] != ACTIVE:
            raise conflict(f"cannot {what} job {job_id}: it is {held[0]['state']}, not active")
        return held

    # ---- info, cancel, heartbeat --------------------------------------------------------------

    def info(self, job_id: str) -> dict:
        held = self.jobs.get(job_id)
        if held is None:
            raise not_found(job_id)
        return public(held[0])

    async def cancel(self, job_id: str) -> dict:
        held = self.jobs.get(job_id)
        if held is None:
            raise not_found(job_id)
        record, revision = held
        if record["state"] in TERMINAL:
            raise conflict(f"job {job_id} is {record['state']}: it can no longer be cancelled")
        cancelled = {**record, "state": CANCELLED, "cancelled_at": iso(utcnow()), "_lease_until": None}
        if not await self._write(cancelled, revision, finished=True):
            raise conflict(f"job {job_id} changed while it was cancelled")
        self._event("job.cancelled", cancelled)
        return public(cancelled)

    async def heartbeat(self, worker_id: Any, active_jobs: Any, visibility: Any = None) -> dict:
        if not isinstance(worker_id, str) or not worker_id:
            raise model.invalid("worker_id is required")
        ids = active_jobs if isinstance(active_jobs, list) else []
        extended, directive = [], "running"
        now = utcnow()
        for job_id in ids:
            held = self.jobs.get(job_id) if isinstance(job_id, str) else None
            if held is None or held[0]["state"] != ACTIVE:
                continue
            record, revision = held
            lease = now + timedelta(milliseconds=model.visibility_ms(record, visibility))
            if await self._write({**record, "_lease_until": iso(lease)}, revision):
                self._arm_deadlines(self.jobs[job_id][0])
                extended.append(job_id)
            hook = ((record.get("options") or {}).get("metadata") or {}).get("test_directive")
            if self.test_mode and hook in ("quiet", "terminate"):
                directive = hook
        return {"state": directive, "jobs_extended": extended, "server_time": iso(now)}

    # ---- dead letters (on_exhaustion: dead_letter) ------------------------------------------------

    def dead_letters(self, queue: str | None, limit: int) -> dict:
        found = [public(r) for r, _ in self.jobs.values()
                 if r.get("_dlq") and r["state"] == DISCARDED and (queue is None or r["queue"] == queue)]
        found.sort(key=lambda j: j.get("discarded_at") or "")
        return {"jobs": found[:limit], "pagination": {"total": len(found), "limit": limit,
                                                      "has_more": len(found) > limit}}

    def _dead(self, job_id: str) -> tuple[dict, int]:
        held = self.jobs.get(job_id)
        if held is None or not held[0].get("_dlq"):
            raise OjsError(404, "not_found", f"no dead letter {job_id}")
        return held

    async def delete_dead_letter(self, job_id: str) -> dict:
        self._dead(job_id)
        await self.store.delete(job_id)
        self.jobs.pop(job_id, None)
        return {"deleted": True, "job_id": job_id}

    async def retry_dead_letter(self, job_id: str) -> dict:
        record, revision = self._dead(job_id)
        now = utcnow()
        again = {**record, "state": AVAILABLE, "attempt": 0, "enqueued_at": iso(now), "_dlq": None,
                 "completed_at": None, "discarded_at": None, "error": None}
        if not await self._write(again, revision):
            raise conflict(f"dead letter {job_id} changed while it was retried")
        self._enqueue(again, self.jobs[job_id][1])
        self._event("job.enqueued", again)
        return public(again)

    # ---- events ---------------------------------------------------------------------------------

    def _event(self, kind: str, record: dict, **data) -> None:
        self.event_seq += 1
        self.events.append({
            "specversion": "1.0", "id": f"evt_{model.uuid7()}", "type": kind, "source": "seamq/jobs",
            "time": iso(utcnow()), "subject": record["id"], "_seq": self.event_seq,
            "data": {"job_id": record["id"], "job_type": record["type"], "queue": record["queue"],
                     "attempt": record["attempt"], **data},
        })

    def list_events(self, types: list[str], queues: list[str], limit: int, after: int = 0) -> dict:
        found = [e for e in self.events if e["_seq"] > after and (not types or e["type"] in types)
                 and (not queues or e["data"]["queue"] in queues)]
        page = found[:limit]
        return {"events": [{k: v for k, v in e.items() if k != "_seq"} for e in page],
                "cursor": str(page[-1]["_seq"]) if page else str(after), "has_more": len(found) > limit}

    # ---- test mode -------------------------------------------------------------------------------

    async def reset(self) -> None:
        await self.store.wipe()
        self._reset_memory()

    # ---- the record, the index, the clocks ---------------------------------------------------------

    async def _write(self, record: dict, revision: int, *, finished: bool = False) -> bool:
        """CAS; on success the cache follows. A lost CAS reloads the record and returns False."""
        try:
            new_revision = await self.store.update(record, revision, finished=finished)
        except Conflict:  # another writer (a timer racing its twin, another instance) was first
            found = await self.store.get(record["id"])
            if found is None:
                self.jobs.pop(record["id"], None)
            elif found[0]["state"] == AVAILABLE:
                self.jobs[record["id"]] = found
                self._enqueue(*found)  # a second heap entry for it is harmless: the first claim wins
            else:
                self.jobs[record["id"]] = found
            return False
        self.jobs[record["id"]] = (record, new_revision)
        return True

    def _enqueue(self, record: dict, revision: int) -> None:
        record["_seq"] = revision  # FIFO: the revision that made it available (monotonic in the stream)
        heapq.heappush(self.ready.setdefault(record["queue"], []), (-record["priority"], revision, record["id"]))

    def _token(self, record: dict) -> dict:
        return {"gen": self.gen, "state": record["state"], "attempt": record["attempt"]}

    async def _arm_run(self, record: dict, at: datetime) -> None:
        await self.store.arm("run", record["id"], at, self._token(record))
        self._deadline_at(at, "run", record)

    async def _arm_expiry(self, record: dict) -> None:
        at = model.parse_time(record["expires_at"])
        await self.store.arm("expire", record["id"], at, {"gen": self.gen})
        self._deadline_at(at, "expire", record)

    def _deadline_at(self, at: datetime, kind: str, record: dict) -> None:
        heapq.heappush(self.deadlines, (at.timestamp(), kind, record["id"], record["attempt"]))
        self._wake.set()

    def _arm_deadlines(self, record: dict) -> None:
        if record.get("_lease_until"):
            heapq.heappush(self.deadlines, (model.parse_time(record["_lease_until"]).timestamp(), "lease",
                                            record["id"], record["attempt"]))
        if record.get("timeout_ms") and record.get("started_at"):
            due = model.parse_time(record["started_at"]).timestamp() + record["timeout_ms"] / 1000
            heapq.heappush(self.deadlines, (due, "timeout", record["id"], record["attempt"]))
        self._wake.set()

    async def _timer_loop(self) -> None:
        while True:
            try:
                for kind, job_id, token, handle in await self.store.fired():
                    try:
                        if token.get("gen") == self.gen:
                            await (self._run_due(job_id, token.get("attempt")) if kind == "run"
                                   else self._expire(job_id))
                    except Exception as exc:  # one bad timer never stops the clock
                        log.error("ojs_timer_failed", job_id=job_id, kind=kind, error=f"{type(exc).__name__}: {exc}")
                    await self.store.done(handle)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the client reconnects
                log.warning("ojs_timers_unavailable", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)

    async def _run_due(self, job_id: str, attempt: Any) -> None:
        held = self.jobs.get(job_id)
        if held is None:
            return
        record, revision = held
        if record["state"] not in (SCHEDULED, RETRYABLE) or record["attempt"] != attempt:
            return
        due = record.get("next_attempt_at") if record["state"] == RETRYABLE else record.get("scheduled_at")
        if due and model.parse_time(due) > utcnow() + timedelta(milliseconds=5):
            return  # armed for an earlier time that no longer applies
        ready = {**record, "state": AVAILABLE, "enqueued_at": iso(utcnow())}
        if await self._write(ready, revision):
            self._enqueue(ready, self.jobs[job_id][1])

    async def _expire(self, job_id: str) -> None:
        held = self.jobs.get(job_id)
        if held is None or held[0]["state"] not in (SCHEDULED, AVAILABLE, RETRYABLE):
            return
        record, revision = held
        expired = {**record, "state": DISCARDED, "discarded_at": iso(utcnow())}
        if await self._write(expired, revision, finished=True):
            self._event("job.expired", expired)

    async def _deadline_loop(self) -> None:
        while True:
            self._wake.clear()
            now = utcnow().timestamp()
            while self.deadlines and self.deadlines[0][0] <= now:
                _, kind, job_id, attempt = heapq.heappop(self.deadlines)
                try:
                    await self._deadline(kind, job_id, attempt)
                except Exception as exc:
                    log.error("ojs_deadline_failed", job_id=job_id, kind=kind, error=f"{type(exc).__name__}: {exc}")
            wait = self.deadlines[0][0] - utcnow().timestamp() if self.deadlines else 3600
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, wait))
            except asyncio.TimeoutError:
                pass

    async def _deadline(self, kind: str, job_id: str, attempt: int) -> None:
        if kind == "run":
            await self._run_due(job_id, attempt)
            return
        if kind == "expire":
            await self._expire(job_id)
            return
        held = self.jobs.get(job_id)
        if held is None or held[0]["state"] != ACTIVE or held[0]["attempt"] != attempt:
            return
        record, revision = held
        if kind == "timeout":
            await self._fail(record, revision, {"code": "timeout", "type": "timeout",
                                                 "message": f"exceeded timeout_ms={record['timeout_ms']}"})
            return
        if model.parse_time(record["_lease_until"]).timestamp() > utcnow().timestamp():
            return  # extended by a heartbeat since this deadline was armed
        released = {**record, "state": AVAILABLE, "enqueued_at": iso(utcnow()), "_lease_until": None,
                    "worker_id": None}
        if await self._write(released, revision):
            self._enqueue(released, self.jobs[job_id][1])
