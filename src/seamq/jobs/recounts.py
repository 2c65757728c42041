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

- An ack bears a mark: this process's epoch and the next number. Its counts move in one atomic batch
  with the process's marks record, which then says every number up to `upto` is counted where its
  record is (but those in `skip`): the record is not written again (a second write of each finished
  record cost the HTTP path a tenth of its rate, docs/benchmarks.md 7z). The marks record moves on
  only past numbers whose outcome is known: an ack whose write's answer never came is read back first
  (not there: skipped, for it may land later, and then counts where its write left it). Only then is
  its ready entry let go: a server that dies first leaves the entry held, it comes again, and the fetch
  that meets it moves the count itself, putting the number in `skip` in the same batch (a compare-and-set
  on the marks record decides between that and this process's batch). So no count is left behind by a
  kill -9, and none is moved twice.
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
import secrets
from dataclasses import replace
from typing import Any, Awaitable

from seamq.jobs import job as moves
from seamq.jobs import tally
from seamq.jobs.job import Aftermath, Job, counted, from_record, to_record
from seamq.jobs.model import FINISHED, OjsError, State
from seamq.jobs.ports import CAS_TRIES, Conflict, JobStore, Write
from seamq.model import describe
from seamq.observability import log

COUNTED_AFTER = 0.25  # seconds after its claim (or its coming due) a job unchanged since is recounted
RECOUNT_WAIT = 0.05  # seconds a recount may wait to share a batch with other commits (ports.Write)
AGAIN = 1.0  # seconds after a round of counting marks that failed (NATS away) the next one starts
TOGETHER = 400  # numbers counted in one batch: their queues' and tenants' tallies stay within model.MAX_BATCH


class Recounts:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._later: dict[str, float] = {}  # claimed or come due here (loop time), not yet recounted
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.epoch, self._given = secrets.token_hex(6), 0  # the marks given out here, numbered from 1
        # What became of each number given out and not yet counted: None while its write is on its way,
        # then (the job, its entry's hold) as stored, False if it surely was not, or the job's id if unknown.
        self._marked: dict[int, tuple[Job, str | None] | str | bool | None] = {}
        self._upto, self._skip, self._revision = 0, [], 0  # this epoch's marks record as last stored
        self._counting = asyncio.Lock()
        self._round_due = False
        self._again: asyncio.TimerHandle | None = None  # the next round, after one that failed
        self._heard: asyncio.Event | None = None  # set when a number's outcome comes, for `drained`
        self._stopped = False

    def stored(self, job: Job, revision: int, after: Aftermath) -> Aftermath:
        """A change of the job stored here (`after`: what it leaves to do): its count moved by it, or left
        to a recount here; an ack's entry then goes once its mark is counted, not now."""
        if job.counted_as is None:
            self._later.pop(job.id, None)
        elif job.state in (State.ACTIVE, State.AVAILABLE):
            self._recount_later(job.id)
        elif job.mark:
            self._later.pop(job.id, None)
            self._resolved(job.mark[1], (job, after.settle))
            return replace(after, settle=None)
        return after

    def mark(self, job: Job) -> Job:
        """An ack that counts later, numbered: every number's outcome must reach `stored` or `unstored`."""
        self._given += 1
        self._marked[self._given] = None
        return moves.marked(job, [self.epoch, self._given])

    def unstored(self, job: Job, surely: bool) -> None:
        """The marked job's write lost its compare-and-set (`surely`), or its answer never came."""
        if not job.mark:
            return
        if not surely:  # read back before its number is passed; its claim's count goes with it
            self._later.pop(job.id, None)
        self._resolved(job.mark[1], False if surely else job.id)

    def _resolved(self, number: int, outcome: tuple[Job, str | None] | str | bool) -> None:
        """Numbers are counted in order: one that comes when those before it are known starts a round."""
        if number <= self._upto:  # counted by a batch whose answer never came (`_read_marks`)
            return
        self._marked[number] = outcome
        if self._heard is not None:
            self._heard.set()
        if not self._round_due and self._marked.get(self._upto + 1) is not None:
            self._round_due = True
            asyncio.get_running_loop().call_soon(lambda: self._spawn(self._round()))

    def _recount_later(self, job_id: str) -> None:
        loop = asyncio.get_running_loop()
        self._later.pop(job_id, None)  # changed again: its place is at the end
        self._later[job_id] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(COUNTED_AFTER, self._recount_due)

    async def drained(self) -> None:
        """Once what this process had left to later when asked is recounted (or its recount failed, and
        was logged): those left to COUNTED_AFTER too, now, and the acks written here before, once their
        writes' outcomes are known. What comes meanwhile is not waited for."""
        while self._later:
            self._spawn(self._logged(self._later.popitem()[0]))
        given = self._given  # acks written before: their numbers' outcomes come within their writes' time
        while any(self._marked.get(n, False) is None for n in range(self._upto + 1, given + 1)):
            self._heard = asyncio.Event()
            await self._heard.wait()
        if self._marked.get(self._upto + 1) is not None:
            self._spawn(self._round())
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        self._stopped = True  # `drained` still counts what is known; a round that fails then is not tried again
        for timer in (self._timer, self._again):
            if timer is not None:
                timer.cancel()
        self._timer = self._again = None

    async def _round(self) -> None:
        """The marks known in order counted, in batches, until none is known (a number resolved meanwhile
        is found by the round on its way: `_round_due` until it ends); one that fails goes again AGAIN later."""
        async with self._counting:
            try:
                lost = 0
                while (went := await self._count()) is not None:
                    lost = 0 if went else lost + 1
                    if lost == CAS_TRIES:
                        raise OjsError(409, "conflict", "the marks record kept changing while this process counted")
            except Exception as exc:
                log.warning("job_recount_failed", epoch=self.epoch, upto=self._upto, error=describe(exc))
                if not self._stopped and self._again is None:
                    self._again = asyncio.get_running_loop().call_later(AGAIN, self._round_again)
            finally:
                self._round_due = False

    def _round_again(self) -> None:
        self._again = None
        self._spawn(self._round())

    async def _count(self) -> bool | None:
        """One batch: the counts of the next numbers whose outcome is known, and the marks record that
        says they are counted; None when none is known, False when the batch lost its compare-and-set."""
        ready: list[tuple[int, tuple[Job, str | None] | str | bool]] = []
        while (outcome := self._marked.get(self._upto + len(ready) + 1)) is not None and len(ready) < TOGETHER:
            ready.append((self._upto + len(ready) + 1, outcome))
        if not ready:
            return None
        moved: list[tally.Move] = []
        skip, holds, acked = list(self._skip), [], dict[tuple[Any, ...], list[Any]]()
        for number, outcome in ready:  # False: never stored, nothing to count
            if isinstance(outcome, tuple):
                holds.append(outcome[1])  # its entry is done with, whoever counts it
                if number not in self._skip:  # else counted by whoever took it
                    acked.setdefault(_kind(outcome[0]), [outcome[0], 0])[1] += 1
            elif isinstance(outcome, str) and number not in self._skip:  # no answer came: the store says
                held = await self.store.get(outcome)
                if held is None or held.record.get("_mark") != [self.epoch, number]:
                    skip.append(number)  # it may land yet, and is then counted where it was
                    await self._logged(outcome)  # as its claim may have left it
                else:
                    moved += tally.counting(held.record)
        for job, n in acked.values():  # the moves of many alike acks, counted once
            moved += [(queue, state, hour, delta * n) for queue, state, hour, delta in tally.counting(counted(job))]
        upto = ready[-1][0]
        write = Write(tally.marks_key(self.epoch), tally.marks_record(self.epoch, upto, skip), self._revision, True,
                      moves=tuple(moved), may_wait=RECOUNT_WAIT)
        try:
            [self._revision] = await self.store.commit([write])
        except Conflict:  # whoever took a number meanwhile put it in `skip`: read again, and go again
            await self._read_marks()
            return False
        except Exception:
            await self._read_marks()  # stored or not, the marks record says
            if self._upto < upto:
                raise
        self._upto, self._skip = upto, skip
        for number, _ in ready:
            self._marked.pop(number, None)
        for hold in holds:
            if hold:
                await _caught(self.store.settle(hold))
        return True

    async def _read_marks(self) -> None:
        held = await self.store.get(tally.marks_key(self.epoch))
        if held is None:  # wiped, or its retention ended with this process idle: made anew
            self._revision = 0
        else:
            self._upto, self._skip, self._revision = held.record["upto"], held.record["skip"], held.revision
            for number in [n for n in self._marked if n <= self._upto]:  # a batch whose answer never came
                del self._marked[number]  # landed: their entries come again, and are let go then

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
            if held is None or job is None or job.counted_as is None or await self._counted(job.mark):
                return
            try:
                await self.store.commit([Write(job.id, to_record(moves.recounted(job)), held.revision,
                                               job.state in FINISHED, counted(job), RECOUNT_WAIT)])
                return
            except Conflict:
                continue
        raise OjsError(409, "conflict", f"job {job_id} kept changing while it was recounted")

    async def _counted(self, mark: list[Any] | None) -> bool:
        """Whether the mark's process counted it (a number of this process's yet to be counted is taken)."""
        if not mark:
            return False
        held = await self.store.get(tally.marks_key(mark[0]))
        return held is not None and tally.covered(mark, {mark[0]: held.record})

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _kind(job: Job) -> tuple[Any, ...]:
    """What says where an ack counts, before and after its mark: acks alike move the same counts."""
    at = job.ended_at
    return job.queue, job.counted_as, job.state, at and at.replace(minute=0, second=0, microsecond=0), \
        (job.meta or {}).get("tenant_id")


async def _caught(work: Awaitable[Any]) -> Any:
    try:
        return await work
    except Exception as exc:
        return exc
