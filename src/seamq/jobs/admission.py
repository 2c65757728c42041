"""What makes a job exist and wait: the part that a job's life (seamq.jobs.operations), workflows
(seamq.jobs.flows) and cron (seamq.jobs.crontab) share, given to each when it is made.

A job's entry in the ready order and its timers are written before the state that needs them
(a server that dies between the two leaves an entry or a timer that is dropped when it comes,
never a job that waits for nothing). New jobs are created with what made them (a workflow, a
cron's next run) in one atomic batch; a workflow's jobs are cancelled with it in one. A timer is
armed in the store, which fires it once to one server whatever dies, and, when due soon, also
told to the engine's clock (`armed`), so it fires on time; the store's copy of such a timer is then
due BACKSTOP later, as the fallback it is (two copies due at once both read the job, and one of
them lost its write: a wasted batch and a stray entry for most scheduled jobs). It calls none of
its users: they are wired in one direction.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, Callable

from seamq.jobs.job import (
    FINISHED, Aftermath, Job, State, aftermath, cancelled, counted, from_record, timer_key, timers, to_record,
)
from seamq.jobs import model, tenants
from seamq.jobs.events import Events
from seamq.jobs.limiter import Limiter
from seamq.jobs.model import OjsError, conflict
from seamq.jobs.ports import Conflict, JobStore, Stored, Write
from seamq.jobs.queues import Queues

WAITING_TIMERS = {"run", "expire"}
BACKSTOP = timedelta(seconds=1)  # the store's copy of a timer the engine's clock also holds comes this much later
Armed = Callable[[str, str, datetime, dict], bool]  # whether the engine's clock holds it too


class Admission:
    def __init__(self, store: JobStore, queues: Queues, events: Events, limiter: Limiter, *,
                 clock: Callable[[], datetime] = model.utcnow, armed: Armed = lambda *timer: False) -> None:
        """`armed`: told of each timer armed here (the engine fires those due soon itself, on time)."""
        self.store, self.queues, self.events, self.limiter, self.clock = store, queues, events, limiter, clock
        self.armed = armed

    async def arm(self, kind: str, key: str, at: datetime, token: dict) -> None:
        """In the store (fires once, to one server, whatever dies); if due soon, also here, on time, and
        the store's copy BACKSTOP later."""
        held = self.armed(kind, key, at, token)
        await self.store.arm(kind, key, at + BACKSTOP if held else at, token)

    async def ready(self, job: Job) -> None:
        """Before a job's new state is stored: its entry when it becomes available, and its clocks."""
        if job.state == State.AVAILABLE:
            await self.store.offer(job.queue, job.priority, job.id, tenants.of_meta(job.meta))
        for timer in timers(job):
            if timer.kind in WAITING_TIMERS:
                kind = "expire" if timer.kind == "expire" else \
                    "retry" if job.state == State.RETRYABLE else "scheduled"
                await self.arm(kind, timer_key(job), timer.at, {"attempt": timer.attempt})

    async def create(self, records: list[dict], also: list[Write] = ()) -> None:
        """New jobs (and `also`, a workflow or a cron that made them) in one atomic batch."""
        await asyncio.gather(*(self.ready(from_record(record)) for record in records))
        try:
            revisions = await self.store.commit([*also, *(Write(r["id"], r) for r in records)])
        except Conflict:
            for record in records:
                if await self.store.get(record["id"]) is not None:
                    raise OjsError(409, "duplicate", f"a job with id {record['id']} already exists",
                                   details={"existing_job_id": record["id"]}) from None
            raise conflict("changed while jobs were created; nothing was created") from None
        for record, revision in zip(records, revisions[len(also):]):
            await self.admitted(record, revision)

    async def refused(self, record: dict) -> None:
        """A relayed job the server refused (seamq.jobs.intake), kept as discarded."""
        try:
            await self.store.commit([Write(record["id"], record, 0, finished=True)])
        except Conflict:
            return
        await self.events.emit("job.discarded", record)

    async def admitted(self, record: dict, revision: int) -> None:
        await self.queues.learn(record)
        await self.limiter.learn(record)
        await self.events.emit("job.enqueued", record)

    async def cancel_all(self, held: list[Stored], also: list[Write]) -> None:
        """Jobs not yet ended, cancelled with `also` in one atomic batch (a workflow's cancel), and
        each let go as any change is; Conflict when one of them moved meanwhile."""
        now, jobs = self.clock(), [(from_record(r), rev) for r, rev in held]
        jobs = [(job, cancelled(job, now), rev) for job, rev in jobs if job.state not in FINISHED]
        await self.store.commit([*also, *(Write(new.id, to_record(new), rev, True, counted(old))
                                          for old, new, rev in jobs)])
        for before, new, _ in jobs:
            await self.let_go(new, aftermath(before, new))

    async def let_go(self, job: Job, after: Aftermath, record: dict | None = None, **data: Any) -> None:
        """Once a job's change is stored: what its old state held and its new one does not
        (seamq.jobs.job.aftermath), then its event, of `record` (the job's, as stored) and `data`."""
        if after.settle:
            await self.store.settle(after.settle)
        if after.withdraw:
            await self.store.withdraw(job.queue, job.priority, job.id, tenants.of_meta(job.meta))
        if after.disarm:
            await self.store.disarm(after.disarm, timer_key(job))
        if after.release:
            await self.limiter.release(job)
        if after.event:
            await self.events.emit(after.event, record or to_record(job), **data)
