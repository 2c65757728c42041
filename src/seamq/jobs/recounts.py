"""Counts that a claim, an ack or a job's coming due left to later, moved: off the path of the worker
who waits on it.

A change of a job's state moves its queue's counts in the same atomic batch as its record
(seamq.jobs.tallied), and on one node nats-server stages each batch on disk, whatever it holds: one
batch at a time bounds the acks and fetches a job server answers (docs/benchmarks.md 7v, 7w, 7x). So
a claim, an ack or a timer's making a job available may instead be one plain compare-and-set that
leaves the job counted where it was (`_counted`, seamq.jobs.job); this process then moves its count,
many jobs to a batch. A count may show such a job where it was for a moment, never elsewhere: a scan
of the records counts `_counted` the same way (seamq.jobs.tally.place), so counts and records agree
at every moment.

- A finished job (an ack counted later) is recounted at once, and only then is its ready entry let
  go: a server that dies first leaves the entry held, it comes again, and the fetch that meets it
  recounts the job (seamq.jobs.operations). So no count is left behind by a kill -9.
- A running job (a claim counted later), or one made available by its timer, is recounted
  COUNTED_AFTER later, unless a change of it came first: any change moves its count, or carries it on
  to its own recount (a job come due is mostly claimed within milliseconds, and recounting it at once
  would lose its compare-and-set to that claim). A server that dies leaves it counted where it was
  (running: until its lease's end; come due: scheduled or retryable, until its next change).

A count read here first recounts what this process left to later (`drained`), so what a worker did
through a server and the counts it reads next through the same server agree; another server shows a
claim or a coming due at most COUNTED_AFTER later, an ack a batch later (docs/jobs.md, "Several
servers").
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Awaitable

from seamq.jobs import job as moves
from seamq.jobs.job import Aftermath, Job, counted, from_record, to_record
from seamq.jobs.model import FINISHED, OjsError, State
from seamq.jobs.ports import CAS_TRIES, Conflict, JobStore, Write
from seamq.model import describe
from seamq.observability import log

COUNTED_AFTER = 0.25  # seconds after its claim (or its coming due) a job unchanged since is recounted
RECOUNT_WAIT = 0.05  # seconds a recount may wait to share a batch with other commits (ports.Write)
TOGETHER = 100  # finished jobs recounted in one commit, with their tallies (model.MAX_BATCH records at most)


class Recounts:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._later: dict[str, float] = {}  # claimed or come due here (loop time), not yet recounted
        self._timer: asyncio.TimerHandle | None = None
        self._finished: list[tuple[Job, int, str | None]] = []  # (job, revision, its entry's hold), this turn
        self._tasks: set[asyncio.Task[None]] = set()

    def stored(self, job: Job, revision: int, after: Aftermath) -> Aftermath:
        """A change of the job stored here (`after`: what it leaves to do): its count moved by it, or left
        to a recount here; a finished job's entry then goes with the recount, not now."""
        if job.counted_as is None:
            self._later.pop(job.id, None)
        elif job.state in (State.ACTIVE, State.AVAILABLE):
            self._recount_later(job.id)
        elif after.finished:
            self._finished_here(job, revision, after.settle)
            return replace(after, settle=None)
        return after

    def _recount_later(self, job_id: str) -> None:
        loop = asyncio.get_running_loop()
        self._later.pop(job_id, None)  # changed again: its place is at the end
        self._later[job_id] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(COUNTED_AFTER, self._recount_due)

    def _finished_here(self, job: Job, revision: int, hold: str | None) -> None:
        """Recounts said in one turn of the loop go to the store together, with no task each."""
        self._later.pop(job.id, None)
        self._finished.append((job, revision, hold))
        if len(self._finished) == 1:
            asyncio.get_running_loop().call_soon(lambda: self._spawn(self._recount_finished()))

    async def drained(self) -> None:
        """Once what this process had left to later when asked is recounted (or its recount failed, and
        was logged): those left to COUNTED_AFTER too, now. What comes meanwhile is not waited for."""
        while self._later:
            self._spawn(self._logged(self._later.popitem()[0]))
        if self._finished:
            self._spawn(self._recount_finished())  # now: the turn's own call then finds none left
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _recount_finished(self) -> None:
        said, self._finished = self._finished, []
        if not said:
            return
        writes = [Write(job.id, to_record(moves.recounted(job)), revision, True, counted(job), RECOUNT_WAIT)
                  for job, revision, _ in said]
        outcomes: list[Any] = []
        for start in range(0, len(writes), TOGETHER):  # one commit (a commit each costs the store more)
            part = writes[start:start + TOGETHER]
            try:
                await self.store.commit(part)
                outcomes += [None] * len(part)
            except Conflict:  # one of them was written meanwhile: each on its own
                outcomes += await self.store.commit_each([[write] for write in part])
            except Exception as exc:
                outcomes += [exc] * len(part)
        for (job, _, hold), outcome in zip(said, outcomes):
            if isinstance(outcome, Conflict):  # written meanwhile: read again
                outcome = await _caught(self.recount(job.id))
            if isinstance(outcome, BaseException):  # its entry comes again, and is recounted then
                log.warning("job_recount_failed", job_id=job.id, error=describe(outcome))
            elif hold:
                await _caught(self.store.settle(hold))

    def _recount_due(self) -> None:
        """The jobs claimed or come due COUNTED_AFTER ago or more and unchanged since, recounted; then the
        timer is set for the oldest left (one timer for them all: they come in time order)."""
        self._timer, loop = None, asyncio.get_running_loop()
        due = loop.time() - COUNTED_AFTER
        while self._later:
            job_id, changed_at = next(iter(self._later.items()))
            if changed_at > due:
                self._timer = loop.call_later(changed_at - due, self._recount_due)
                return
            del self._later[job_id]
            self._spawn(self._logged(job_id))

    async def _logged(self, job_id: str) -> None:
        if isinstance(failed := await _caught(self.recount(job_id)), BaseException):  # counted where it was until
            log.warning("job_recount_failed", job_id=job_id, error=describe(failed))  # its next change

    async def recount(self, job_id: str) -> None:
        """The job's count moved to where its record is, as last stored (nothing to do when it is there)."""
        for _ in range(CAS_TRIES):
            held = await self.store.get(job_id)
            job = from_record(held.record) if held else None
            if held is None or job is None or job.counted_as is None:
                return
            try:
                await self.store.commit([Write(job.id, to_record(moves.recounted(job)), held.revision,
                                               job.state in FINISHED, counted(job), RECOUNT_WAIT)])
                return
            except Conflict:
                continue
        raise OjsError(409, "conflict", f"job {job_id} kept changing while it was recounted")

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _caught(work: Awaitable[Any]) -> Any:
    try:
        return await work
    except Exception as exc:
        return exc
