"""The job operations of a server that keeps no index (engine v2, issue 29): every answer comes from
the store port, so any number of servers serve the same queues, and a server's memory does not grow
with the backlog. Each state change is a transition of seamq.jobs.job, stored by compare-and-set.

The ready order holds each running job's entry as its lease. When a hold runs out the entry comes
again to whichever server takes from that queue next: if its job is still running under that entry
and its lease has passed, the attempt is recorded as `lease_expired` and the job claimed anew; an
entry whose job has moved on (finished, cancelled, claimed under another entry) is settled and
dropped. Timers (scheduled, retry, expiry, timeout) fire once, to one server.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any, Callable

from seamq.jobs import job as J
from seamq.jobs import model
from seamq.jobs.model import OjsError, conflict, not_found
from seamq.jobs.ports import Conflict, Fired, JobStore, Taken, Write

DEFAULT_LEASE_MS = model.DEFAULT_VISIBILITY_MS


class Operations:
    def __init__(self, store: JobStore, *, clock: Callable[[], datetime] = model.utcnow,
                 rng: random.Random | None = None) -> None:
        self.store, self.clock, self.rng = store, clock, rng or random.Random()
        # The jobs this server handed out, as it stored them: their ack or heartbeat, which usually comes
        # back here, needs no read. A copy another server moved on since makes the CAS fail; it is then read.
        self.mine: dict[str, tuple[J.Job, int]] = {}

    # ---- the record -------------------------------------------------------------------------------

    async def load(self, job_id: Any) -> tuple[J.Job, int]:
        if not isinstance(job_id, str) or not job_id:
            raise model.invalid("job_id is required")
        held = await self.store.get(job_id)
        if held is None:
            raise not_found(job_id)
        return J.from_record(held[0]), held[1]

    async def _change(self, job_id: Any, move: Callable[[J.Job], J.Job]) -> J.Job:
        """Apply `move` to the job as last stored here (else as read) and store it; read and try once
        more when the copy held here was stale."""
        held = self.mine.get(job_id) if isinstance(job_id, str) else None
        for attempt in range(2):
            job, revision = held if held is not None else await self.load(job_id)
            moved = move(job)
            try:
                await self._store(moved, revision, job)
                return moved
            except OjsError as exc:
                if held is None or exc.status != 409:
                    raise
                held = None  # stale: read it
        raise AssertionError("unreachable")

    async def _store(self, job: J.Job, revision: int, before: J.Job | None = None) -> int:
        """Write a job's next state by CAS; then what the state needs: an entry in the ready order
        when it became available, its clocks, and the end of the hold it ran under."""
        try:
            [stored] = await self.store.commit([Write(job.id, J.to_record(job), revision, job.state in J.FINISHED)])
        except Conflict:
            raise conflict(f"job {job.id} changed meanwhile; read it again") from None
        if job.state == J.State.ACTIVE:
            self.mine[job.id] = (job, stored)
        else:
            self.mine.pop(job.id, None)
        if before is not None and before.hold and before.hold != job.hold:
            await self.store.settle(before.hold)
        if job.state == J.State.AVAILABLE:
            await self.store.offer(job.queue, job.priority, job.id, stored, J.to_record(job))
        for timer in J.timers(job):
            if timer.kind in ("run", "expire", "timeout"):
                await self.store.arm(timer.kind, job.id, timer.at, {"attempt": timer.attempt})
        return stored

    # ---- producers --------------------------------------------------------------------------------

    async def push(self, body: Any) -> dict:
        job = J.from_record(model.new_record(body, self.clock()))
        try:
            await self._store(job, 0)
        except OjsError:
            raise OjsError(409, "duplicate", f"a job with id {job.id} already exists",
                           details={"existing_job_id": job.id}) from None
        return J.public(job)

    async def info(self, job_id: str) -> dict:
        return J.public((await self.load(job_id))[0])

    async def cancel(self, job_id: str) -> dict:
        return J.public(await self._change(job_id, lambda job: J.cancelled(job, self.clock())))

    # ---- workers ----------------------------------------------------------------------------------

    async def fetch(self, queues: list[str], count: int = 1, worker_id: str | None = None,
                    visibility_ms: int | None = None) -> list[dict]:
        lease = timedelta(milliseconds=visibility_ms or DEFAULT_LEASE_MS)
        out: list[dict] = []
        for queue in queues:
            while len(out) < count:
                taken = await self.store.take(queue, count - len(out), lease.total_seconds())
                if not taken:
                    break
                for entry in taken:
                    claimed = await self._claim(entry, worker_id, lease)
                    if claimed is not None:
                        out.append(J.public(claimed))
        return out

    async def _claim(self, taken: Taken, worker_id: str | None, lease: timedelta) -> J.Job | None:
        if taken.record is not None and taken.deliveries == 1:  # the common case: claim as offered, no read
            offered = J.from_record(taken.record)
            if offered.state == J.State.AVAILABLE:
                claimed = J.claimed(offered, self.clock(), worker_id, lease, taken.entry, taken.hold)
                try:
                    [stored] = await self.store.commit([Write(offered.id, J.to_record(claimed), taken.revision)])
                    return await self._started(claimed, stored)
                except Conflict:
                    pass  # it moved on since: read it, as below
        held = await self.store.get(taken.job_id)
        if held is None:
            await self.store.settle(taken.hold)
            return None
        job, revision = J.from_record(held[0]), held[1]
        now = self.clock()
        if job.state == J.State.ACTIVE and job.entry == taken.entry:
            if job.lease_until and job.lease_until > now:  # extended while the hold was running out
                await self.store.hold(taken.hold, (job.lease_until - now).total_seconds())
                return None
            job = J.released(job, now, {"code": "lease_expired", "type": "LeaseExpired", "message":
                                        f"worker {job.worker_id or '?'} sent no ack, nack or heartbeat within the "
                                        "visibility timeout: the job went back to its queue"})
        elif job.state != J.State.AVAILABLE:  # it moved on since this entry was offered
            await self.store.settle(taken.hold)
            return None
        claimed = J.claimed(job, now, worker_id, lease, taken.entry, taken.hold)
        try:
            [stored] = await self.store.commit([Write(job.id, J.to_record(claimed), revision)])
        except Conflict:
            return None  # another server moved it first; this entry comes again and is settled then
        return await self._started(claimed, stored)

    async def _started(self, claimed: J.Job, revision: int) -> J.Job:
        self.mine[claimed.id] = (claimed, revision)
        for timer in J.timers(claimed):
            if timer.kind == "timeout":
                await self.store.arm(timer.kind, claimed.id, timer.at, {"attempt": timer.attempt})
        return claimed

    async def ack(self, job_id: Any, result: Any = None) -> dict:
        return J.public(await self._change(job_id, lambda job: J.completed(job, self.clock(), result)))

    async def nack(self, job_id: Any, error: Any = None, requeue: bool = False) -> dict:
        def move(job: J.Job) -> J.Job:
            now = self.clock()
            return J.released(job, now, error) if requeue else J.failed(job, now, error, self.rng)
        return J.public(await self._change(job_id, move))

    async def heartbeat(self, worker_id: str, job_ids: list[str], visibility_ms: int | None = None) -> dict:
        lease = timedelta(milliseconds=visibility_ms or DEFAULT_LEASE_MS)
        extended, cancelled = [], []
        for job_id in job_ids:
            try:
                job, revision = await self.load(job_id)
            except OjsError:
                continue
            if job.state == J.State.CANCELLED:
                cancelled.append(job_id)
            if job.state != J.State.ACTIVE:
                continue
            longer = J.extended(job, self.clock(), lease)
            try:
                await self.store.commit([Write(job.id, J.to_record(longer), revision)])
            except Conflict:
                continue
            await self.store.hold(job.hold, lease.total_seconds())
            extended.append(job_id)
        return {"jobs_extended": extended, "jobs_cancelled": cancelled}

    # ---- clocks -----------------------------------------------------------------------------------

    async def fire(self, fired: Fired) -> None:
        """A timer came due (to this server alone): move the job if the timer still applies."""
        held = await self.store.get(fired.key)
        if held is not None:
            job, revision = J.from_record(held[0]), held[1]
            if fired.token.get("attempt") == job.attempt:
                await self._due(fired.kind, job, revision)
        await self.store.done(fired)

    async def _due(self, kind: str, job: J.Job, revision: int) -> None:
        now = self.clock()
        try:
            if kind == "run" and job.state in (J.State.SCHEDULED, J.State.RETRYABLE):
                await self._store(J.due(job, now), revision, job)
            elif kind == "expire" and job.state in J.WAITING:
                await self._store(J.expired(job, now), revision, job)
            elif kind == "timeout" and job.state == J.State.ACTIVE:
                error = {"code": "timeout", "type": "timeout", "message": f"exceeded timeout_ms={job.timeout_ms}"}
                await self._store(J.failed(job, now, error, self.rng), revision, job)
        except OjsError:  # another server or request moved it first: the timer no longer applies
            pass

    async def tick(self, batch: int = 100) -> int:
        """Fire what is due now; how many timers fired."""
        fired = await self.store.fired(batch, 0)
        for timer in fired:
            await self.fire(timer)
        return len(fired)
