"""The OJS engine: what a job server does, over the job store port, with nothing of the backlog in memory.

Any number of servers run it on one store: each answer is read from the store
and each change is a compare-and-set there (ADR-013a in docs/jobs.md). The
parts, each in its module:

- seamq.jobs.operations: a job's life (push, fetch, ack, nack, heartbeat,
  cancel) and its clocks (scheduled, retry, expiry, timeout);
- seamq.jobs.flows and seamq.jobs.crontab: workflows and cron jobs;
- seamq.jobs.queues: pause, maintenance, rate limits, counts;
- seamq.jobs.events: this server's events and throughput meter;
- seamq.jobs.ext: the schema registry and progress.

This module wires them, runs the loops a server needs (fired timers, the
followed flags, relayed jobs) and answers the admin's listings, which read
through the store (they cost a pass over it, and keep nothing).
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import random
import time
from dataclasses import replace
from datetime import datetime
from typing import Callable

from seamq.backoff import NO_JITTER, Backoff
from seamq.jobs import intake, model
from seamq.jobs.admission import Admission
from seamq.jobs.job import FINISHED, counted, released, retried
from seamq.jobs.crontab import Crontab
from seamq.jobs.events import EVENTS_KEPT, Events
from seamq.jobs.ext import Schemas
from seamq.jobs.flows import Flows
from seamq.jobs.hooks import Subscriptions
from seamq.jobs.model import OjsError, conflict
from seamq.jobs.operations import Operations
from seamq.jobs.ports import Conflict, Fired, JobStore, Write
from seamq.jobs.limiter import Limiter
from seamq.jobs.queues import Queues
from seamq.jobs.recounts import Recounts
from seamq.jobs.tallied import Tallied
from seamq.model import ErrorCode, SeamqError, describe
from seamq.observability import log
from seamq.stopping import wait_event

__all__ = ["EVENTS_KEPT", "Engine"]

# A timer that came before the change it was armed for was stored, or whose firing failed, comes again:
# the engine's copy HELD_TRIES times HELD_AGAIN apart (then its store copy is the one left), the store's
# by EARLY_TIMER, for minutes (a change stored that late, or a store failing that long, is not the
# common case, but a job left waiting for a timer that gave up is never seen again).
HELD_AGAIN, HELD_TRIES = 0.05, 10
EARLY_TIMER = Backoff(base=0.5, cap=30.0, spread=NO_JITTER)  # by the store copy's deliveries
EARLY_TIMER_TRIES = 14  # about 4 minutes
FLAGS_WAIT = 30.0  # seconds for the followed flags at start
SOON = 60.0  # seconds: a timer due within this is also kept here (bounded by the timer rate, not the backlog)
GC_THRESHOLD = 10_000  # allocations between the collector's youngest rounds (Python's default: 700)


def collect_less() -> None:
    """For a process whose work is an engine (`seamq jobs serve`, `seamq jobs worker --nats`): jobs make
    and drop many small objects, and at Python's default threshold the collector runs every few jobs,
    each of its oldest rounds scanning all that start-up made (docs/benchmarks.md 7k, 7y). That lives as
    long as the process: collected once, then frozen, it is never scanned again."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 10, 10)


class Engine:
    def __init__(self, store: JobStore, *, test_mode: bool = False, rng: random.Random | None = None,
                 clock: Callable[[], datetime] = model.utcnow, count_claims_later: bool = False,
                 count_acks_later: bool = False) -> None:
        store = Tallied(store, clock=clock)  # type: ignore[assignment]  # the store, with its counts
        self.store, self.clock, self.recounts = store, clock, Recounts(store)
        self.events = Events(store, clock)
        self.queues = Queues(store, clock, self.recounts)
        self.limiter = Limiter(store, clock)
        admission = Admission(store, self.queues, self.events, self.limiter, clock=clock, armed=self._keep_if_due_soon)
        self.flows, self.crontab = Flows(admission), Crontab(admission)
        self.schemas = Schemas(store, self.queues)
        self.webhooks = Subscriptions(store, self.queues, clock)
        self.ops = Operations(store, self.queues, self.events, admission, self.limiter, flows=self.flows, check_schema=self.schemas.check,
                              rng=rng, test_mode=test_mode, clock=clock, count_claims_later=count_claims_later,
                              count_acks_later=count_acks_later, recounts=self.recounts)
        self._deadlines: list[tuple[float, int, Fired]] = []  # timers due within SOON, armed here
        self._wake, self._count = asyncio.Event(), itertools.count()
        self._firing = False  # whether this engine fires timers itself (`start(clocks=True)`)
        self.workers, self.meter, self.started_at = self.ops.workers, self.events.meter, clock()
        self._tasks: list[asyncio.Task] = []

    async def start(self, *, clocks: bool = True) -> "Engine":
        """Follow the flags and, with `clocks`, fire timers and take in relayed jobs as they come (a
        unit test leaves them out and calls `tick` on the clock it moves)."""
        self._tasks = [asyncio.create_task(self.queues.follow()), asyncio.create_task(self.events.run())]
        self._firing = clocks
        if clocks:
            self._tasks += [asyncio.create_task(self._timer_loop()), asyncio.create_task(self._deadline_loop()),
                            asyncio.create_task(intake.run(self))]
        try:  # the flags known before the first fetch
            await asyncio.wait_for(self.queues.ready.wait(), FLAGS_WAIT)
        except asyncio.TimeoutError:
            await self.stop()
            raise SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"the job server could not read its queue flags from NATS "
                             f"(KV OJS_JOBS) within {FLAGS_WAIT:.0f} s; is JetStream up and reachable?") from None
        return self

    async def stop(self) -> None:
        self.recounts.stop()
        try:
            await asyncio.wait_for(self.recounts.drained(), 2)
        except Exception as exc:  # their entries come again, and are recounted then
            log.warning("jobs_recounts_unwritten", error=describe(exc))
        try:
            await asyncio.wait_for(self.events.flush(), 2)  # what this server did, told before it goes
        except Exception as exc:
            log.warning("ojs_events_unwritten", held=len(self.events.pending), error=describe(exc))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()

    async def _timer_loop(self) -> None:
        while True:
            try:
                fired = await self.store.fired(100, 1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the client reconnects
                log.warning("ojs_timers_unavailable", error=describe(exc))
                await asyncio.sleep(0.5)
                continue
            # Timers of different jobs concurrently, so that jobs due together come out together.
            await asyncio.gather(*(self._fire(timer) for timer in fired))

    async def tick(self) -> int:
        """Fire what is due now; how many timers fired."""
        fired = await self.store.fired(100, 0)
        for timer in fired:
            await self._fire(timer)
        return len(fired)

    def _keep_if_due_soon(self, kind: str, key: str, at: datetime, token: dict) -> bool:
        if not self._firing or at.timestamp() - time.time() >= SOON:
            return False
        heapq.heappush(self._deadlines, (at.timestamp(), next(self._count), Fired(kind, key, token, None)))
        self._wake.set()
        return True

    async def _deadline_loop(self) -> None:
        """The timers this server armed that fall due soon, fired on time; the store's copy fires a moment
        later (admission.BACKSTOP), and finds nothing left to do (or does it, if this server died first)."""
        while True:
            self._wake.clear()
            due = []
            while self._deadlines and self._deadlines[0][0] <= time.time():
                due.append(heapq.heappop(self._deadlines)[2])
            await asyncio.gather(*(self._fire(timer) for timer in due))
            wait = self._deadlines[0][0] - time.time() if self._deadlines else SOON
            await wait_event(self._wake, max(wait, 0))

    async def _fire(self, timer: Fired) -> None:
        try:
            if timer.kind == "cron":
                await self.crontab.fire(timer.key, timer.token.get("attempt"))
                ended = True
            else:
                ended = await self.ops.fire(timer)
        except Exception as exc:  # one bad timer never stops the clock
            # The store's copy each time (minutes apart at most); the engine's copy once, not at each
            # of its tries 50 ms apart (an outage with many timers due would fill the log).
            if timer.handle is not None or timer.deliveries == 1:
                log.error("ojs_timer_failed", key=timer.key, kind=timer.kind, deliveries=timer.deliveries,
                          error=describe(exc))
            ended = False
        try:
            if not ended and await self._again(timer):
                return
            if timer.handle is not None:
                await self.store.done(timer)
        except Exception as exc:  # it comes again when the store's hold of it ends
            log.error("ojs_timer_failed", key=timer.key, kind=timer.kind, deliveries=timer.deliveries,
                      error=describe(exc))

    async def _again(self, timer: Fired) -> bool:
        """A timer that came before its change was stored, or whose firing failed, handed out again
        (True), or let go once it has had its tries (the engine's copy: its store copy is left)."""
        if timer.handle is None:
            if timer.deliveries >= HELD_TRIES:
                return False
            heapq.heappush(self._deadlines, (time.time() + HELD_AGAIN, next(self._count),
                                             replace(timer, deliveries=timer.deliveries + 1)))
            return True  # (fired in the deadline loop, which reads the heap again once its round is done)
        if timer.deliveries >= EARLY_TIMER_TRIES:
            log.error("ojs_timer_dropped", key=timer.key, kind=timer.kind, deliveries=timer.deliveries,
                      reason="the change it was armed for was never stored, or its firing failed each time")
            return False
        await self.store.again(timer, EARLY_TIMER.delay(timer.deliveries))
        return True

    async def reset(self) -> None:
        await self.store.wipe()
        self.queues.flags.clear()
        self.ops.handed_out.clear()
        self.events.clear()
        self.limiter.forget()

    # ---- what joins two parts; the routes call the parts themselves for the rest -------------------

    async def set_paused(self, queue: str, paused: bool) -> dict:
        answer = await self.queues.set_paused(queue, paused)
        await self.events.emit("queue.paused" if paused else "queue.resumed",
                               {"id": queue, "type": "", "queue": queue, "attempt": 0})
        return answer

    # ---- the admin: listings, retry, delete, dead letters, a worker's jobs -------------------------

    async def jobs(self, queue: str | None = None, state: str | None = None) -> list[dict]:
        """Every job record held (finished ones until their retention ends), of `queue` and in `state`
        when given: a pass over the store."""
        return [r for r, _ in await self.store.scan("")
                if (queue is None or r["queue"] == queue) and (state is None or r["state"] == state)]

    async def retry(self, job_id: str) -> dict:
        """A discarded or cancelled job runs again: available, attempt 0, its errors kept as history.
        A workflow's job may run again; its workflow keeps the outcome it recorded first."""
        before, _, record = await self.ops.change(job_id, lambda job: retried(job, self.clock()))
        if before.dead_letter:
            await self.store.delete(f"dlq.{job_id}")
        await self.events.emit("job.enqueued", record)
        return model.public(record)

    async def delete(self, job_id: str) -> dict:
        """A finished job is removed before its retention ends (the admin API's purge and bulk delete)."""
        job, revision = await self.ops.load(job_id)
        if job.state not in FINISHED:
            raise conflict(f"job {job_id} is {job.state.value}: only finished jobs can be deleted; cancel it first")
        try:
            await self.store.commit([Write(job_id, None, revision, before=counted(job))])
        except Conflict:
            raise conflict(f"job {job_id} changed meanwhile; read it again") from None
        if job.dead_letter:
            await self.store.delete(f"dlq.{job_id}")
        return {"deleted": True, "job_id": job_id}

    async def dead_letters(self, queue: str | None) -> list[dict]:
        held = await self.store.get_many([marker["id"] for marker, _ in await self.store.scan("dlq.")])
        found = [model.public(record) for record, _ in held.values()
                 if record.get("_dlq") and (queue is None or record["queue"] == queue)]
        return sorted(found, key=lambda j: j.get("discarded_at") or "")

    async def _dead(self, job_id: str) -> None:
        held = await self.store.get(job_id) if model.is_job_id(job_id) else None
        if held is None or not held.record.get("_dlq"):
            raise OjsError(404, "not_found", f"no dead letter {job_id}")

    async def delete_dead_letter(self, job_id: str) -> dict:
        await self._dead(job_id)
        return await self.delete(job_id)

    async def retry_dead_letter(self, job_id: str) -> dict:
        await self._dead(job_id)
        return await self.retry(job_id)

    async def release_worker(self, worker_id: str) -> list[str]:
        """A stale worker's active jobs go back to their queues now, each attempt recorded as failed
        (`worker_lost`), rather than when their leases end."""
        let_go = []
        for record in await self.jobs(state="active"):
            if record.get("worker_id") == worker_id:
                error = {"code": "worker_lost", "type": "WorkerLost", "retryable": True,
                         "message": f"worker {worker_id} was deregistered while it ran attempt {record['attempt']}"}
                try:
                    await self.ops.change(record["id"], lambda job, error=error: released(job, self.clock(), error))
                except OjsError:
                    continue  # it ended meanwhile
                let_go.append(record["id"])
        return let_go
