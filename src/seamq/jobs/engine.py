"""The OJS engine: job operations, workflows, cron, queues, and the clocks that move jobs on their own.

The records live in NATS KV (seamq.jobs.store) and every transition is a CAS
on the revision last seen, so a job is claimed once however many fetches race
for it; changes that belong together (an ack with the workflow step it starts,
a cron fire with its job, a bulk enqueue) are one atomic batch. What a record
cannot answer quickly is mirrored in seamq.jobs.index, rebuilt from KV at start.
One engine serves a set of buckets at a time (ADR-013a in docs/jobs.md).

Clocks: scheduled jobs, retry backoff, expiry and cron fires are JetStream
`@at` schedules, so they survive restarts of either process, and also
deadlines in the index, for precision: measured on nats-server 2.15, a
schedule armed after a stream purge fired 250 ms late and one armed earlier
than a pending one 50 ms late, while the suite checks retries 200 ms after
they are due. Whichever fires first moves the job; the other then finds
nothing to do. Leases and `timeout_ms` are index deadlines only, re-armed from
the records at start. A timer carries the job's attempt and the engine's
generation (new at each reset and start), so one that no longer applies
changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import deque
from datetime import datetime, timedelta
from typing import Any

from seamq.jobs import cron, intake, model, workflows
from seamq.jobs.activity import Meter, Workers
from seamq.jobs.ext import Schemas
from seamq.jobs.index import Index
from seamq.jobs.model import (
    ACTIVE, AVAILABLE, CANCELLED, COMPLETED, DISCARDED, RETRYABLE, SCHEDULED, TERMINAL, OjsError, conflict, iso,
    not_found, public, utcnow,
)
from seamq.jobs.store import RECORD_TTL_SECONDS, Conflict, JobStore, Write
from seamq.observability import log
from seamq.stopping import wait_event

EVENTS_KEPT = 10_000
MAINTENANCE = "system.maintenance"
FINISHED_AT = ("completed_at", "discarded_at", "cancelled_at")
METERED = {"job.completed": "processed", "job.retrying": "failed", "job.discarded": "failed",
           "job.enqueued": "enqueued"}


class Engine:
    def __init__(self, store: JobStore, *, test_mode: bool = False, rng: random.Random | None = None) -> None:
        self.store = store
        self.test_mode = test_mode
        self.rng = rng or random.Random()
        self._reset_memory()
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._workflow_lock = asyncio.Lock()  # a workflow's steps end one at a time
        self.schemas = Schemas(self)

    def _reset_memory(self) -> None:
        self.index = Index()
        self.events: deque[tuple[int, str, str | None, bytes]] = deque(maxlen=EVENTS_KEPT)
        self.event_seq = 0
        # Timers carry the generation they were armed in: a reset (and a restart, which re-arms
        # every timer from the records) starts a new one, so no earlier timer changes anything.
        self.gen = self.rng.getrandbits(62)
        self.workers, self.meter, self.started_at = Workers(), Meter(), utcnow()

    async def start(self) -> "Engine":
        async for record, revision in self.store.all_records():
            await self._recover(record, revision)
        self._tasks = [asyncio.create_task(self._timer_loop()), asyncio.create_task(self._deadline_loop()),
                       asyncio.create_task(intake.run(self))]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()

    async def _recover(self, record: dict, revision: int) -> None:
        """After a restart: index what waits, re-arm what is timed (a timer already due fires at once)."""
        self.index.put(record, revision)
        kind = record.get("_kind")
        if kind == "cron":
            if record.get("enabled", True):
                await self._arm_cron(record)
        elif kind is None:
            await self._arm_job(record)

    # ---- push -----------------------------------------------------------------------------------

    async def push(self, body: Any) -> tuple[int, dict]:
        record = model.new_record(body, utcnow())
        self.schemas.check(record)
        existing = await self._unique(record)
        if existing is not None:
            return 200, public(existing)
        await self._create([record])
        return 201, public(record)

    async def push_batch(self, body: Any) -> list[dict]:
        """All or nothing: every item is validated, then all are stored in one atomic batch."""
        records = model.new_records(body, utcnow())
        for index, record in enumerate(records):
            try:
                self.schemas.check(record)
            except OjsError as exc:
                raise OjsError(exc.status, exc.code, f"jobs[{index}]: {exc.message}", details=exc.details) from None
        await self._create(records)
        return [public(r) for r in records]

    async def admit_refused(self, record: dict) -> None:
        """A relayed job the server refused (seamq.jobs.intake), kept as discarded."""
        if await self._commit([Write(record, 0, finished=True)]):
            self._finished(record)
            self._event("job.discarded", record)

    async def _create(self, records: list[dict], also: list[Write] = ()) -> None:
        if not await self._commit([*also, *(Write(r) for r in records)]):
            taken = next((r["id"] for r in records if self.index.revision(r["id"]) is not None), None)
            if taken is None:
                raise conflict("changed while jobs were created; nothing was created")
            raise OjsError(409, "duplicate", f"a job with id {taken} already exists",
                           details={"existing_job_id": taken})
        for record in records:
            await self._admitted(record, self.index.revision(record["id"]))

    async def _admitted(self, record: dict, revision: int) -> None:
        self.index.put(record, revision)
        await self._arm_job(record)
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
        holder = self.index.get(holder_id)
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
        self.workers.seen(worker_id, utcnow(), queues)
        out: list[dict] = []
        for queue in queues:
            if len(out) >= count:
                break
            if self._paused(queue):
                continue
            limit = self.index.limits.get(queue)
            allowed = limit.take(count - len(out)) if limit else count - len(out)
            taken = 0
            while taken < allowed:
                # The candidates leave the heap at once and are claimed concurrently (one CAS each, so
                # a batch costs one round trip, not `count`); one lost to a racing writer is replaced.
                candidates = self.index.take_available(queue, allowed - taken)
                if not candidates:
                    break
                claims = await asyncio.gather(*(self._claim(*held, worker_id, visibility) for held in candidates))
                for claimed in filter(None, claims):
                    out.append(public(claimed))
                    taken += 1
            if limit:
                limit.tokens += allowed - taken  # what the queue did not have is not spent
        return out

    async def _claim(self, record: dict, revision: int, worker_id: Any, visibility: Any) -> dict | None:
        now = utcnow()
        if record.get("expires_at") and model.parse_time(record["expires_at"]) <= now:
            await self._expire(record["id"])
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
        if not await self._end(done, revision):
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
        written = await (self._end(failed, revision) if outcome.state in TERMINAL else self._write(failed, revision))
        if not written:
            raise conflict(f"job {record['id']} changed while it was failed")
        if outcome.state == RETRYABLE:
            await self._arm_run(failed, now + timedelta(seconds=outcome.retry_delay))
            self._event("job.retrying", failed)
        elif outcome.state == DISCARDED:
            self._event("job.discarded", failed)
        return failed

    def _active(self, job_id: Any, what: str) -> tuple[dict, int]:
        if not isinstance(job_id, str) or not job_id:
            raise model.invalid("job_id is required")
        held = self._job(job_id)
        if held[0]["state"] != ACTIVE:
            raise conflict(f"cannot {what} job {job_id}: it is {held[0]['state']}, not active")
        return held

    def _job(self, job_id: str) -> tuple[dict, int]:
        held = self.index.get(job_id)
        if held is None or held[0].get("_kind"):
            raise not_found(job_id)
        return held

    # ---- info, cancel, heartbeat --------------------------------------------------------------

    def info(self, job_id: str) -> dict:
        return public(self._job(job_id)[0])

    def record(self, job_id: str) -> dict:
        """A job's whole record (internal fields too), for the extensions that read beside the envelope."""
        return self._job(job_id)[0]

    async def cancel(self, job_id: str) -> dict:
        record, revision = self._job(job_id)
        if record["state"] in TERMINAL:
            raise conflict(f"job {job_id} is {record['state']}: it can no longer be cancelled")
        cancelled = {**record, "state": CANCELLED, "cancelled_at": iso(utcnow()), "_lease_until": None}
        if not await self._end(cancelled, revision):
            raise conflict(f"job {job_id} changed while it was cancelled")
        self._event("job.cancelled", cancelled)
        return public(cancelled)

    async def heartbeat(self, worker_id: Any, active_jobs: Any, visibility: Any = None,
                        active_job_ids: Any = None) -> dict:
        """Extend the leases of the jobs the worker names. `jobs_cancelled` names those cancelled
        meanwhile; `state: terminate` asks the worker to stop when every job it named was cancelled
        (the SDKs' workers know no other way to stop one job, and none of its other jobs is hurt)."""
        if not isinstance(worker_id, str) or not worker_id:
            raise model.invalid("worker_id is required")
        ids = model.heartbeat_ids(active_jobs, active_job_ids)
        extended, cancelled = [], []
        now = utcnow()
        directive = self.workers.beat(worker_id, len(ids), now) or "running"  # asked through the admin API
        for job_id in ids:
            held = self.index.get(job_id)
            if held is not None and held[0].get("state") == CANCELLED:
                cancelled.append(job_id)
            if held is None or held[0].get("state") != ACTIVE:
                continue
            record, revision = held
            lease = now + timedelta(milliseconds=model.visibility_ms(record, visibility))
            extended_record = {**record, "_lease_until": iso(lease)}
            if await self._write(extended_record, revision):
                self._arm_deadlines(extended_record)
                extended.append(job_id)
            hook = ((record.get("options") or {}).get("metadata") or {}).get("test_directive")
            if self.test_mode and hook in ("quiet", "terminate"):
                directive = hook
        if cancelled and len(cancelled) == len(ids):
            directive = "terminate"
        return {"state": directive, "jobs_extended": extended, "jobs_cancelled": cancelled,
                "server_time": iso(now)}

    # ---- workflows ----------------------------------------------------------------------------

    async def create_workflow(self, body: Any) -> dict:
        workflow, first = workflows.new(body, utcnow())
        await self._create(first, also=[Write(workflow)])
        self._event("workflow.started", workflow)
        return self._public_workflow(workflow)

    def workflow(self, workflow_id: str) -> dict:
        return self._public_workflow(self._workflow(workflow_id)[0])

    def workflows(self) -> list[dict]:
        found = [self._public_workflow(r) for r, _ in self.index.of_kind("workflow")]
        return sorted(found, key=lambda w: w["created_at"], reverse=True)

    def _public_workflow(self, workflow: dict) -> dict:
        states = {job_id: held[0]["state"] for job_id in workflows.job_ids_of(workflow)
                  if (held := self.index.get(job_id)) is not None}
        return workflows.public(workflow, states)

    def _workflow(self, workflow_id: str) -> tuple[dict, int]:
        held = self.index.get(workflows.key(workflow_id))
        if held is None:
            raise OjsError(404, "not_found", f"workflow {workflow_id} not found")
        return held

    async def cancel_workflow(self, workflow_id: str) -> dict:
        """The workflow and each of its jobs not yet ended, in one atomic batch; later steps never start."""
        async with self._workflow_lock:
            workflow, revision = self._workflow(workflow_id)
            now = utcnow()
            stopped = workflows.cancelled(workflow, now)
            jobs = [held for held in map(self.index.get, workflows.job_ids_of(workflow))
                    if held is not None and held[0]["state"] not in TERMINAL]
            writes = [Write(stopped, revision), *(
                Write({**r, "state": CANCELLED, "cancelled_at": iso(now), "_lease_until": None}, rev, True)
                for r, rev in jobs)]
            if not await self._commit(writes):
                raise conflict(f"workflow {workflow_id} changed while it was cancelled")
        for write in writes[1:]:
            self._finished(write.record)
            self._event("job.cancelled", write.record)
        self._event("workflow.cancelled", stopped)
        return self._public_workflow(stopped)

    # ---- cron ---------------------------------------------------------------------------------

    async def register_cron(self, body: Any) -> dict:
        record = cron.new(body, utcnow())
        held = self.index.get(record["_key"])
        if not await self._write(record, held[1] if held else 0):
            raise conflict(f"cron {record['name']} changed while it was registered")
        if record["enabled"]:
            await self._arm_cron(record)
        return cron.public(record)

    async def set_cron_enabled(self, name: str, enabled: bool) -> dict:
        held = self.index.get(cron.key(name))
        if held is None:
            raise OjsError(404, "not_found", f"cron {name} not found")
        record = {**held[0], "enabled": enabled}
        if enabled:
            record["next_run_at"] = iso(cron.parse(record["expression"]).next_after(utcnow(), record["timezone"]))
        if not await self._write(record, held[1]):
            raise conflict(f"cron {name} changed while it was {'enabled' if enabled else 'disabled'}")
        if enabled:
            await self._arm_cron(record)
        else:
            await self.store.disarm("cron", record["_key"])
        return cron.public(record)

    def crons(self) -> list[dict]:
        return sorted((cron.public(r) for r, _ in self.index.of_kind("cron")), key=lambda c: c["name"])

    async def delete_cron(self, name: str) -> dict:
        key = cron.key(name)
        held = self.index.get(key)
        if held is None:
            raise OjsError(404, "not_found", f"cron {name} not found")
        await self.store.delete(key)
        self.index.drop(key)
        await self.store.disarm("cron", key)
        return cron.public(held[0])

    async def _fire_cron(self, key: str, due_ms: int) -> None:
        held = self.index.get(key)
        if held is None or not held[0].get("enabled", True):
            return
        record, revision = held
        due = model.parse_time(record["next_run_at"])
        if int(due.timestamp() * 1000) != due_ms:
            return  # a timer for a run that is no longer the next one
        now = utcnow()
        following = {**record, "next_run_at": iso(cron.parse(record["expression"]).next_after(
            max(now, due), record["timezone"]))}
        last = self.index.get(record.get("_last_job_id") or "")
        if record["overlap_policy"] == "skip" and last is not None and last[0]["state"] not in TERMINAL:
            if await self._write(following, revision):
                self._event("cron.skipped", last[0])
        else:
            job = model.new_record(record["job_template"], now)
            following["_last_job_id"] = job["id"]
            try:
                await self._create([job], also=[Write(following, revision)])
            except OjsError:  # the cron changed (deleted, replaced) since this fire was armed
                return
            self._event("cron.triggered", job)
        await self._arm_cron(self.index.get(key)[0])

    # ---- queues ---------------------------------------------------------------------------------

    def _paused(self, queue: str) -> bool:
        held = self.index.get(f"queue.{queue}")
        system = self.index.get(MAINTENANCE)
        return (held is not None and held[0]["paused"]) or (system is not None and system[0]["enabled"])

    def maintenance(self) -> dict:
        held = self.index.get(MAINTENANCE)
        return {k: v for k, v in held[0].items() if not k.startswith("_")} if held else {"enabled": False}

    async def set_maintenance(self, enabled: bool, reason: str | None, ends_at: str | None) -> dict:
        """Maintenance: no fetch gets a job, from any queue, until it ends; jobs are still accepted,
        and scheduled ones become available on time, to run when it ends."""
        held = self.index.get(MAINTENANCE)
        record = {"_key": MAINTENANCE, "_kind": "system", "enabled": enabled, "reason": reason,
                  "started_at": iso(utcnow()) if enabled else None, "ends_at": ends_at if enabled else None}
        if not await self._write(record, held[1] if held else 0):
            raise conflict("maintenance mode changed meanwhile; read it again")
        return self.maintenance()

    async def set_paused(self, queue: str, paused: bool) -> dict:
        key = f"queue.{model.check_queue(queue)}"
        held = self.index.get(key)
        record = {"_key": key, "_kind": "queue", "name": queue, "paused": paused}
        if not await self._write(record, held[1] if held else 0):
            raise conflict(f"queue {queue} changed while it was {'paused' if paused else 'resumed'}")
        self._event("queue.paused" if paused else "queue.resumed", {"id": queue, "type": "", "queue": queue,
                                                                     "attempt": 0})
        return {"name": queue, "paused": paused}

    def queue_stats(self, queue: str) -> dict:
        return {"name": model.check_queue(queue), **self.index.stats(queue), "paused": self._paused(queue)}

    def queues(self) -> list[dict]:
        """Every queue that holds or held a job, or was paused, and `default` always."""
        names = {model.DEFAULT_QUEUE, *(q for q, _ in self.index.counts),
                 *(r["name"] for r, _ in self.index.of_kind("queue"))}
        return [{"name": name, "status": "paused" if self._paused(name) else "active", "paused": self._paused(name)}
                for name in sorted(names)]

    # ---- dead letters (on_exhaustion: dead_letter) ------------------------------------------------

    def dead_letters(self, queue: str | None) -> list[dict]:
        found = [public(r) for r in self.index.dead_letters() if queue is None or r["queue"] == queue]
        return sorted(found, key=lambda j: j.get("discarded_at") or "")

    def _dead(self, job_id: str) -> tuple[dict, int]:
        held = self.index.get(job_id)
        if held is None or not held[0].get("_dlq"):
            raise OjsError(404, "not_found", f"no dead letter {job_id}")
        return held

    async def delete_dead_letter(self, job_id: str) -> dict:
        self._dead(job_id)
        await self.store.delete(job_id)
        self.index.drop(job_id)
        return {"deleted": True, "job_id": job_id}

    async def retry_dead_letter(self, job_id: str) -> dict:
        self._dead(job_id)
        return await self.retry(job_id)

    # ---- admin: every job, retry, delete, a worker's jobs --------------------------------------

    def jobs(self, queue: str | None = None, state: str | None = None) -> list[dict]:
        """Every job record held (finished ones until their retention ends), of `queue` and in `state`
        when given: those are held beside each record, so only the records asked for are decoded."""
        return [self.index.get(job_id)[0] for job_id, held in list(self.index.jobs.items())
                if (queue is None or held[2] == queue) and (state is None or held[3] == state)]

    async def retry(self, job_id: str) -> dict:
        """A discarded or cancelled job runs again: available, attempt 0, its errors kept as history.
        A workflow's job may run again; its workflow keeps the outcome it recorded first."""
        record, revision = self._job(job_id)
        if record["state"] not in (DISCARDED, CANCELLED):
            raise conflict(f"job {job_id} is {record['state']}: only discarded or cancelled jobs can be retried")
        again = {**record, "state": AVAILABLE, "attempt": 0, "enqueued_at": iso(utcnow()), "_dlq": None,
                 "completed_at": None, "discarded_at": None, "cancelled_at": None, "error": None}
        if not await self._write(again, revision):
            raise conflict(f"job {job_id} changed while it was retried")
        self._event("job.enqueued", again)
        return public(again)

    async def delete(self, job_id: str) -> dict:
        """A finished job is removed before its retention ends (the admin API's purge and bulk delete)."""
        record, _ = self._job(job_id)
        if record["state"] not in TERMINAL:
            raise conflict(f"job {job_id} is {record['state']}: only finished jobs can be deleted; cancel it first")
        await self.store.delete(job_id)
        self.index.drop(job_id)
        return {"deleted": True, "job_id": job_id}

    async def release_worker(self, worker_id: str) -> list[str]:
        """A stale worker's active jobs go back to their queues now, each attempt recorded as failed
        (`worker_lost`), rather than when their leases end."""
        released = []
        for record in self.jobs(state=ACTIVE):
            if record.get("worker_id") == worker_id:
                held = self.index.get(record["id"])
                error = {"code": "worker_lost", "type": "WorkerLost", "retryable": True,
                         "message": f"worker {worker_id} was deregistered while it ran attempt {record['attempt']}"}
                await self._fail(*held, error, requeue=True)
                released.append(record["id"])
        return released

    # ---- events ---------------------------------------------------------------------------------

    def _event(self, kind: str, record: dict, **data) -> None:
        """Kept as (seq, type, queue, JSON): ten thousand of them as dicts would cost the server 12 MB."""
        self.event_seq += 1
        event = {
            "specversion": "1.0", "id": f"evt_{model.uuid7()}", "type": kind, "source": "seamq/jobs",
            "time": iso(utcnow()), "subject": record["id"],
            "data": {"job_id": record["id"], "job_type": record.get("type"), "queue": record.get("queue"),
                     "attempt": record.get("attempt"), **data},
        }
        self.events.append((self.event_seq, kind, record.get("queue"), json.dumps(event).encode()))
        metered = METERED.get(kind)
        if metered and record.get("queue"):
            self.meter.count(metered, record["queue"], utcnow())

    def list_events(self, types: list[str], queues: list[str], limit: int, after: int = 0) -> dict:
        found = [e for e in self.events if e[0] > after and (not types or e[1] in types)
                 and (not queues or e[2] in queues)]
        page = found[:limit]
        return {"events": [json.loads(e[3]) for e in page], "cursor": str(page[-1][0]) if page else str(after),
                "has_more": len(found) > limit}

    # ---- test mode -------------------------------------------------------------------------------

    async def reset(self) -> None:
        await self.store.wipe()
        self._reset_memory()

    # ---- writing --------------------------------------------------------------------------------

    async def _write(self, record: dict, revision: int) -> bool:
        """One record's CAS; False (with the index reloaded) when another writer was first."""
        return await self._commit([Write(record, revision)])

    async def _commit(self, writes: list[Write]) -> bool:
        try:
            revisions = await self.store.commit(writes)
        except Conflict:  # another writer (a timer racing its twin, another instance) was first
            for write in writes:
                found = await self.store.get(write.key)
                if found is None:
                    self.index.drop(write.key)
                else:
                    self.index.put(*found)
            return False
        for write, revision in zip(writes, revisions):
            self.index.put(write.record, revision)
        return True

    async def _end(self, record: dict, revision: int) -> bool:
        """A job reaches a terminal state; with its workflow's next move in the same atomic batch."""
        if not record.get("workflow_id"):
            written = await self._commit([Write(record, revision, finished=True)])
        else:
            async with self._workflow_lock:
                held = self.index.get(workflows.key(record["workflow_id"]))
                moved, started = workflows.job_ended(held[0], record, utcnow()) if held else (None, [])
                writes = [Write(record, revision, finished=True),
                          *([Write(moved, held[1], finished=moved["state"] != workflows.RUNNING)] if moved else []),
                          *(Write(job) for job in started)]
                written = await self._commit(writes)
            if written:
                for job in started:
                    await self._admitted(job, self.index.revision(job["id"]))
                if moved and moved["state"] != workflows.RUNNING:
                    self._event(f"workflow.{moved['state']}", moved)
        if written:
            self._finished(record)
        return written

    def _finished(self, record: dict) -> None:
        """Forget a finished record when KV does (its per-message TTL)."""
        ended = next((record[k] for k in FINISHED_AT if record.get(k)), None)
        if ended:
            self.index.at(model.parse_time(ended).timestamp() + RECORD_TTL_SECONDS, "forget", record["id"])
            self._wake.set()

    # ---- clocks --------------------------------------------------------------------------------

    async def _arm_job(self, record: dict) -> None:
        state = record["state"]
        if state == SCHEDULED:
            await self._arm_run(record, model.parse_time(record["scheduled_at"]))
        elif state == RETRYABLE:
            await self._arm_run(record, model.parse_time(record["next_attempt_at"]))
        elif state == ACTIVE:
            self._arm_deadlines(record)
        elif state in TERMINAL:
            self._finished(record)
        if state in (SCHEDULED, AVAILABLE, RETRYABLE) and record.get("expires_at"):
            at = model.parse_time(record["expires_at"])
            await self.store.arm("expire", record["id"], at, {"gen": self.gen})
            self._deadline_at(at, "expire", record["id"])

    async def _arm_run(self, record: dict, at: datetime) -> None:
        await self.store.arm("run", record["id"], at, {"gen": self.gen, "attempt": record["attempt"]})
        self._deadline_at(at, "run", record["id"], record["attempt"])

    async def _arm_cron(self, record: dict) -> None:
        at = model.parse_time(record["next_run_at"])
        due_ms = int(at.timestamp() * 1000)
        await self.store.arm("cron", record["_key"], at, {"gen": self.gen, "attempt": due_ms})
        self._deadline_at(at, "cron", record["_key"], due_ms)

    def _deadline_at(self, at: datetime, kind: str, key: str, attempt: int = 0) -> None:
        self.index.at(at.timestamp(), kind, key, attempt)
        self._wake.set()

    def _arm_deadlines(self, record: dict) -> None:
        if record.get("_lease_until"):
            self.index.at(model.parse_time(record["_lease_until"]).timestamp(), "lease", record["id"],
                          record["attempt"])
        if record.get("timeout_ms") and record.get("started_at"):
            due = model.parse_time(record["started_at"]).timestamp() + record["timeout_ms"] / 1000
            self.index.at(due, "timeout", record["id"], record["attempt"])
        self._wake.set()

    async def _timer_loop(self) -> None:
        while True:
            try:
                for kind, key, token, handle in await self.store.fired():
                    if token.get("gen") == self.gen:
                        await self._due(kind, key, token.get("attempt", 0))
                    await self.store.done(handle)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the client reconnects
                log.warning("ojs_timers_unavailable", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)

    async def _deadline_loop(self) -> None:
        while True:
            self._wake.clear()
            by_key: dict[str, list[tuple[str, int]]] = {}
            for kind, key, attempt in self.index.due(utcnow().timestamp()):
                by_key.setdefault(key, []).append((kind, attempt))
            # Keys concurrently, so that jobs due together (a batch scheduled for one moment) come out
            # together rather than one CAS round trip after another; one key's deadlines in order.
            keys = list(by_key.items())
            for start in range(0, len(keys), 256):
                await asyncio.gather(*(self._due_in_order(key, dues) for key, dues in keys[start:start + 256]))
            upcoming = self.index.next_deadline()
            wait = upcoming - utcnow().timestamp() if upcoming is not None else 3600
            await wait_event(self._wake, wait)

    async def _due_in_order(self, key: str, dues: list[tuple[str, int]]) -> None:
        for kind, attempt in dues:
            await self._due(kind, key, attempt)

    async def _due(self, kind: str, key: str, attempt: int) -> None:
        try:
            if kind == "run":
                await self._run_due(key, attempt)
            elif kind == "expire":
                await self._expire(key)
            elif kind == "cron":
                await self._fire_cron(key, attempt)
            elif kind == "forget":
                held = self.index.get(key)
                ended = next((held[0][k] for k in FINISHED_AT if held[0].get(k)), None) if held else None
                # A job retried and finished again since this was armed has a later end (and timer).
                if ended and held[0]["state"] in TERMINAL and \
                        model.parse_time(ended).timestamp() + RECORD_TTL_SECONDS <= utcnow().timestamp() + 1:
                    self.index.drop(key)
            else:
                await self._lease_or_timeout(kind, key, attempt)
        except Exception as exc:  # one bad timer never stops the clock
            log.error("ojs_timer_failed", key=key, kind=kind, error=f"{type(exc).__name__}: {exc}")

    async def _run_due(self, job_id: str, attempt: Any) -> None:
        held = self.index.get(job_id)
        if held is None:
            return
        record, revision = held
        if record["state"] not in (SCHEDULED, RETRYABLE) or record["attempt"] != attempt:
            return
        due = record.get("next_attempt_at") if record["state"] == RETRYABLE else record.get("scheduled_at")
        if due and model.parse_time(due) > utcnow() + timedelta(milliseconds=5):
            return  # armed for an earlier time that no longer applies
        await self._write({**record, "state": AVAILABLE, "enqueued_at": iso(utcnow())}, revision)

    async def _expire(self, job_id: str) -> None:
        held = self.index.get(job_id)
        if held is None or held[0]["state"] not in (SCHEDULED, AVAILABLE, RETRYABLE):
            return
        record, revision = held
        expired = {**record, "state": DISCARDED, "discarded_at": iso(utcnow())}
        if await self._end(expired, revision):
            self._event("job.expired", expired)

    async def _lease_or_timeout(self, kind: str, job_id: str, attempt: int) -> None:
        held = self.index.get(job_id)
        if held is None or held[0]["state"] != ACTIVE or held[0]["attempt"] != attempt:
            return
        record, revision = held
        if kind == "timeout":
            await self._fail(record, revision, {"code": "timeout", "type": "timeout",
                                                 "message": f"exceeded timeout_ms={record['timeout_ms']}"})
            return
        if model.parse_time(record["_lease_until"]).timestamp() > utcnow().timestamp():
            return  # extended by a heartbeat since this deadline was armed
        # The attempt ended without a verdict: back to the queue, and in the job's history as a failed one.
        worker = record.get("worker_id") or "?"
        log.warning("job_lease_expired", job_id=job_id, worker_id=worker, attempt=attempt)
        await self._fail(record, revision, {"code": "lease_expired", "type": "LeaseExpired", "message":
                                            f"worker {worker} sent no ack, nack or heartbeat within the visibility "
                                            "timeout: the job went back to its queue"}, requeue=True)
