"""A job's life over the store port (push, fetch, ack, nack, heartbeat, cancel, and its timers when
they fire), for servers that keep no index: any number of them serve the same queues. Each state
change is a transition of seamq.jobs.job, stored by compare-and-set; what makes a job exist and
wait (its entry, its timers, its creation) is seamq.jobs.admission's, given to it when it is made,
as are its workflows' moves (seamq.jobs.flows) and the schema check.

What a new state needs is written before it: the entry of a job that becomes available, the timers
of one that waits. A server that dies between the two leaves an entry or a timer that is dropped
when it comes (its job never moved), never a job that waits for nothing; and the request or the
timer that made the change gets no answer, so it comes again. A running job's entry is held for
its lease: when the hold runs out, the entry comes again to whichever server fetches next, which
holds it for what remains of the lease, or records the attempt as `lease_expired` and claims the
job anew.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta
from typing import Any, Callable

from seamq.backoff import NO_JITTER, Backoff
from seamq.jobs import job as moves  # one pure function per change of state: moves.claimed(job, now, ...)
from seamq.jobs.job import WAITING, Aftermath, Job, State, aftermath, counted, from_record, public, timer_key, to_record
from seamq.jobs import limits, model, unique
from seamq.jobs.activity import Workers
from seamq.jobs.admission import Admission
from seamq.jobs.events import Events
from seamq.jobs.limiter import Limiter
from seamq.jobs.model import FINISHED, OjsError, conflict, not_found
from seamq.jobs.ports import CAS_TRIES, TAKEN_HOLD, Conflict, Fired, JobStore, Stored, Taken, WorkflowMoves, Write
from seamq.jobs.queues import Queues
from seamq.jobs.recounts import Recounts
from seamq.model import describe
from seamq.observability import log


HANDED_OUT_KEPT = 25_000  # jobs handed out here, kept for their ack (bounded: most are acked within seconds,
# and one pushed out costs its ack a read; docs/benchmarks.md 7k for its memory)
EARLY_ENTRY = Backoff(base=0.01, cap=5.0, spread=NO_JITTER)  # by the entry's deliveries
EARLY_ENTRY_TRIES = 16  # an entry taken before its record was stored comes again, for about 40 s


class Lost(OjsError):
    """A compare-and-set lost: the job changed after it was read (read it again and try again)."""


class Operations:
    def __init__(self, store: JobStore, queues: Queues, events: Events, admission: Admission, limiter: Limiter, *,
                 flows: WorkflowMoves | None = None,  # what a job's end does to its workflow
                 check_schema: Callable[[dict], None] = lambda record: None,  # the registry's check of new args
                 clock: Callable[[], datetime] = model.utcnow, rng: random.Random | None = None,
                 test_mode: bool = False, count_claims_later: bool = False, count_acks_later: bool = False,
                 recounts: Recounts | None = None) -> None:
        self.store, self.queues, self.events, self.admission, self.limiter = store, queues, events, admission, limiter
        self.flows, self.check_schema, self.clock = flows, check_schema, clock
        self.rng, self.test_mode, self.workers = rng or random.Random(), test_mode, Workers()
        # One plain write, its count moved later (seamq.jobs.recounts): a claim and a job's coming due
        # (what a fetch waits for) with `count_claims_later`, an ack with `count_acks_later`.
        self.count_claims_later, self.count_acks_later = count_claims_later, count_acks_later
        self.recounts = recounts or Recounts(store)
        # The jobs handed out here, as stored: their ack, which usually comes back here, needs no read
        # (a copy another server moved on since fails its CAS, and is then read).
        self.handed_out: dict[str, tuple[Job, int]] = {}

    # ---- the record -------------------------------------------------------------------------------

    async def load(self, job_id: Any) -> tuple[Job, int]:
        if not isinstance(job_id, str) or not job_id:
            raise model.invalid("job_id is required")
        held = await self.store.get(job_id) if model.is_job_id(job_id) else None
        if held is None:
            raise not_found(job_id)
        return from_record(held.record), held.revision

    async def exists(self, job_id: Any) -> bool:
        return model.is_job_id(job_id) and await self.store.get(job_id) is not None

    async def record(self, job_id: Any) -> dict:
        """A job's whole record (internal fields too), for the extensions that read beside the envelope."""
        return to_record(await self._current(job_id))

    async def _current(self, job_id: Any) -> Job:
        """The job as it is now: one whose lease ran out goes back to its queue as it is read (else it
        would wait for the next fetch of its queue to meet its entry, as the rescuers of River and Oban
        wait for their next round)."""
        job, revision = await self.load(job_id)
        if job.state == State.ACTIVE and job.lease_until and job.lease_until <= self.clock():
            released = self._lease_expired(job)
            try:
                await self._store(released, revision, job)
                return released
            except OjsError:
                return (await self.load(job_id))[0]
        return job

    def _lease_expired(self, job: Job) -> Job:
        log.warning("job_lease_expired", job_id=job.id, worker_id=job.worker_id or "?", attempt=job.attempt)
        return moves.lease_expired(job, self.clock())

    async def change(self, job_id: Any, move: Callable[[Job], Job], *,
                     may_wait: float = 0.0) -> tuple[Job, Job, dict]:
        """Apply `move` to the job as last stored here (else as read) and store it. (before, after,
        after's record.) A copy held here that moved on through another server is read again; a
        compare-and-set lost to a write made meanwhile (the same worker's heartbeat, a timer) is read
        and tried again: only a move that the job's state as last stored refuses is refused.
        `may_wait`: seconds the write may wait to share a batch (ports.Write)."""
        held = self.handed_out.get(job_id) if isinstance(job_id, str) else None
        for _ in range(CAS_TRIES):
            job, revision = held if held is not None else await self.load(job_id)
            try:
                moved = move(job)
                return job, moved, (await self._store(moved, revision, job, may_wait))[1]
            except Lost:
                held = None
            except OjsError as exc:
                if held is None or exc.status != 409:
                    raise
                held = None
        raise conflict(f"job {job_id} kept changing while this request tried to change it; try again")

    async def _store(self, job: Job, revision: int, before: Job, may_wait: float = 0.0) -> tuple[int, dict]:
        """Write a job's next state by CAS, with its workflow's next move when it ended. What the new
        state needs comes first: its entry in the ready order when it became available, its clocks
        (an entry or a timer whose change was never stored is dropped when it comes). Then what its
        old state held and its new one does not, and its event (seamq.jobs.job.aftermath)."""
        after = aftermath(before, job)
        await self.admission.ready(job)
        if job.counted_as and after.finished:  # an ack counted later: numbered, its outcome told (recounts)
            job = self.recounts.mark(job)
        record = to_record(job)
        try:
            revisions, started, moved = await self._written(job, record, revision, before, after, may_wait)
        except BaseException as exc:
            self.recounts.unstored(job, surely=isinstance(exc, (Conflict, Lost)))
            raise
        await self.after_stored(job, revisions[0], before, after, record)
        for new, revision in zip(started, revisions[2:]):
            await self.admission.admitted(new, revision)
        if self.flows is not None:
            await self.flows.ended(moved)
        return revisions[0], record

    async def _written(self, job: Job, record: dict, revision: int, before: Job, after: Aftermath,
                       may_wait: float) -> tuple[list[int], list[dict], dict | None]:
        """The job's write, its workflow's next move and its dead letter, in one commit: their revisions,
        the workflow's jobs started and the workflow as moved."""
        for attempt in range(CAS_TRIES):
            writes, started, moved = [Write(job.id, record, revision, after.finished, counted(before), may_wait)], [], None
            if after.workflow and self.flows is not None:
                extra, started, moved = await self.flows.ending(record)
                writes += extra
            if after.dead_letter:
                writes.append(Write(f"dlq.{job.id}", {"_key": f"dlq.{job.id}", "id": job.id}, None, True))
            try:
                return await self.store.commit(writes), started, moved
            except Conflict:
                current = await self.store.get(job.id) if len(writes) > 1 and attempt < CAS_TRIES - 1 else None
                if current is None or current.revision != revision:
                    raise Lost(409, "conflict", f"job {job.id} changed meanwhile; read it again") from None
                # the job is as it was: its workflow moved on meanwhile (another of its jobs ended)
        raise Lost(409, "conflict", f"job {job.id}'s workflow kept changing; read it again")

    async def after_stored(self, job: Job, revision: int, before: Job, after: Aftermath, record: dict) -> None:
        """Once `job` is stored over `before`: the copy kept for its next change, and what it lets go."""
        self.handed_out.pop(job.id, None)
        if job.state == State.ACTIVE:
            self._hand_out(job, revision)
        data = {} if job.state != State.COMPLETED else dict(result=job.result, duration_ms=round(
            (job.completed_at - before.started_at).total_seconds() * 1000) if before.started_at else 0)
        await self.admission.let_go(job, self.recounts.stored(job, revision, after), record, **data)

    def _hand_out(self, job: Job, revision: int) -> None:
        self.handed_out[job.id] = (job, revision)
        if len(self.handed_out) > HANDED_OUT_KEPT:  # acked through another server: forget the oldest
            del self.handed_out[next(iter(self.handed_out))]

    # ---- producers --------------------------------------------------------------------------------

    async def push(self, body: Any) -> tuple[int, dict]:
        record = model.new_record(body, self.clock())
        self.check_schema(record)
        await self.queues.bounded([record])
        existing = await unique.apply(self.store, record, self.cancel)
        if existing is not None:
            return 200, model.public(existing)
        await self.admission.create([record])
        return 201, model.public(record)

    async def push_batch(self, body: Any) -> list[dict]:  # all or nothing: validated, then stored in one atomic batch
        records = model.new_records(body, self.clock())
        for index, record in enumerate(records):
            try:
                self.check_schema(record)
            except OjsError as exc:
                raise OjsError(exc.status, exc.code, f"jobs[{index}]: {exc.message}", details=exc.details) from None
        await self.queues.bounded(records)  # past a queue's bound, the whole batch is refused
        await self.admission.create(records)
        return [model.public(r) for r in records]

    async def info(self, job_id: str) -> dict:
        return public(await self._current(job_id))

    async def cancel(self, job_id: str) -> dict:
        _, job, record = await self.change(job_id, lambda job: moves.cancelled(job, self.clock()))
        return model.public(record)

    # ---- workers ----------------------------------------------------------------------------------

    async def fetch(self, queues: Any, count: Any = 1, worker_id: Any = None, visibility: Any = None,
                    tenant: str | None = None) -> list[dict]:  # a tenant's jobs alone (seamq.jobs.tenants)
        model.check_fetch(queues, count)
        if not self.workers.fetching(worker_id, self.clock(), queues, self.queues.said_by(worker_id)):
            return []
        worker = worker_id if isinstance(worker_id, str) else None
        out: list[dict] = []
        for queue, share in self.queues.shares(queues, count):  # by its pool's strategy, else in order
            if len(out) >= count or await self.queues.paused_now(queue):
                continue
            allowed = await self.queues.take_tokens(queue, min(share, count - len(out)))
            got, seen = 0, 0
            while got < allowed and seen < 4 * allowed + 64:  # entries held back (rate limits) walked at most
                taken = await self.store.take(queue, allowed - got, tenant)
                if not taken:
                    break
                seen += len(taken)
                held = await self.store.get_many([t.job_id for t in taken])
                for claimed in await self._claims(taken, held, worker, visibility):
                    if claimed is not None:
                        out.append(model.public(claimed))
                        got += 1
            await self.queues.give_back(queue, allowed - got)
        # A fetch slower than a lease (a starved server) may meet its own claim again, run out, and
        # claim the job anew: the worker gets the job once, as last claimed.
        return list({job["id"]: job for job in out}.values())

    async def _claims(self, taken: list[Taken], held: dict[str, Stored], worker_id: str | None,
                      visibility: Any) -> list[dict | None]:
        """The claims of one take. The jobs read as available and naming no rate limit key are claimed
        together (`_claimed`); the others, and those whose CAS lost, as `_claim` decides for each."""
        now, plain, rest = self.clock(), [], []
        for t in taken:
            hint = held.get(t.job_id)
            job = from_record(hint.record) if hint else None
            if job is None or job.state != State.AVAILABLE or (job.expires and job.expires <= now) or self.limiter.names(job):
                rest.append((t, hint))
            else:
                plain.append((job, hint.revision, t, job, now))
        out, lost = await self._claimed(plain, worker_id, visibility)
        rest += [(t, None) for t in lost]  # read again
        return [*out, *await asyncio.gather(*(self._claim(t, hint, worker_id, visibility) for t, hint in rest))]

    async def _claim(self, taken: Taken, held: Stored | None, worker_id: str | None,
                     visibility: Any) -> dict | None:
        """Claim the job of an entry taken, read with the fetch's batch (`get_many`, which may lag the
        last write): what that read shows is tried, and anything else is decided again on the record
        as last stored, so no entry is dropped for a record a replica had not yet applied."""
        for latest in (False, True, True):  # the hint, then the record as last stored (again if a CAS lost)
            if latest:
                await self.store.landed(taken.job_id)  # its change, if on its way from here: the entry is written first
                held = await self.store.get(taken.job_id)
            read, revision = (from_record(held.record), held.revision) if held else (None, 0)
            job, now = read, self.clock()
            if job is not None and job.state == State.ACTIVE and job.entry == taken.entry:
                if job.lease_until and job.lease_until > now:  # a lease longer than the hold, or extended
                    if latest:
                        await self.store.hold(taken.hold, (job.lease_until - now).total_seconds())
                        return None
                    continue
                job = self._lease_expired(job)
            elif latest and job is not None and job.counted_as and job.state in FINISHED:  # its server died
                try:  # before it counted the job (seamq.jobs.recounts)
                    await self.recounts.recount(job.id)
                except Exception as exc:  # the fetch's other claims stand: this entry comes again
                    log.warning("job_recount_failed", job_id=job.id, error=describe(exc))
                    return None
                break
            elif job is None or job.state != State.AVAILABLE:
                if not latest:
                    continue
                # Entries are offered before the record that says so: the change may be on its way (it
                # comes again shortly), or it never came or moved on long since (the entry is dropped).
                await (self.store.hold(taken.hold, EARLY_ENTRY.delay(taken.deliveries))
                       if taken.deliveries < EARLY_ENTRY_TRIES else self.store.settle(taken.hold))
                return None
            if job.expires and job.expires <= now:
                if await self._instead(moves.expired(job, now), revision, taken, read):
                    return None
                continue
            if (verdict := await self.limiter.admit(job, now)) is not None:
                if verdict.wait_ms:
                    return await self._held_back(job, revision, taken, read, verdict)
                now = limits.moment(verdict.at_ms)  # the start its key counted
            claimed, _ = await self._claimed([(job, revision, taken, read, now)], worker_id, visibility)
            if claimed:
                return claimed[0]
        await self.store.settle(taken.hold)  # claimed through another entry of it, or moved on, as it was read
        return None

    async def _claimed(self, claims: list[tuple[Job, int, Taken, Job, datetime]], worker_id: str | None,
                       visibility: Any) -> tuple[list[dict], list[Taken]]:
        """Claims (job, revision, entry, job as read, start) stored together, a CAS each and no task each: the
        records claimed, and the entries whose CAS lost. A lease shorter than the entry's hold holds it for the
        lease; a longer one (30 minutes by default) meets its entry again, and `_claim` holds it for the rest."""
        made = []
        for job, revision, taken, read, now in claims:
            lease = moves.lease(job, visibility)
            claimed = moves.claimed(job, now, worker_id, lease, taken.entry, taken.hold, self.count_claims_later)
            made.append((claimed, to_record(claimed), revision, taken, read, lease))
        await asyncio.gather(*(  # armed first: a timeout that comes before its claim is stored waits for it
            self.admission.arm("timeout", timer_key(claimed), claimed.started_at + timedelta(
                milliseconds=claimed.timeout_ms), {"attempt": claimed.attempt}) for claimed, *_ in made if claimed.timeout_ms))
        outcomes = await self.store.commit_each(
            [[Write(claimed.id, record, revision, before=counted(read))] for claimed, record, revision, _, read, _ in made])
        out, lost = [], []
        for (claimed, record, _, taken, read, lease), outcome in zip(made, outcomes):
            if isinstance(outcome, Conflict):
                lost.append(taken)
            elif not isinstance(outcome, BaseException):
                self._hand_out(claimed, outcome[0])
                after = self.recounts.stored(claimed, outcome[0], aftermath(read, claimed))
                if lease.total_seconds() < TAKEN_HOLD:
                    await self.store.hold(taken.hold, lease.total_seconds())
                await self.events.emit(after.event, record)
                out.append(record)
        if failed := [e for e in outcomes if isinstance(e, BaseException) and not isinstance(e, Conflict)]:
            raise failed[0]  # stored or not, nobody knows: the fetch fails, as it did for one claim alone
        return out, lost

    async def _instead(self, moved: Job, revision: int, taken: Taken, read: Job) -> bool:
        """`moved` stored instead of a claim of the job met in `taken` (`read` as stored); False if it moved on."""
        try:
            await self._store(moved, revision, read)
        except OjsError:
            return False
        await self.store.settle(taken.hold)
        return True

    async def _held_back(self, job: Job, revision: int, taken: Taken, read: Job, verdict: limits.Verdict) -> None:
        """A job its rate limit key does not let start yet: as its policy says (`on_limit`), its entry
        comes again when the key may let it (`wait`), or it is scheduled for then, or discarded."""
        now, on_limit, wait = self.clock(), verdict.on_limit, verdict.held_for(taken.deliveries, self.rng)
        if on_limit == "wait" and job.state == read.state:
            await self.store.hold(taken.hold, wait)
        else:  # a lease that ran out is stored as such first
            await self._instead(job if on_limit == "wait" else moves.deferred(job, now + timedelta(seconds=wait))
                                if on_limit == "reschedule" else moves.dropped(job, now, verdict.refusal()), revision, taken, read)
        if taken.deliveries == 1 or on_limit != "wait":  # a wait told once, not each time it is looked at
            await self.events.emit(f"rate_limit.{'dropped' if on_limit == 'drop' else 'exceeded'}", to_record(read),
                                   **verdict.told())

    async def ack(self, job_id: Any, result: Any = None, *, may_wait: float = 0.0) -> dict:
        """The job's record as stored once completed (an answer is the face's: attempts.ack_answer)."""
        return (await self.change(job_id, lambda job: moves.completed(job, self.clock(), result, self.count_acks_later),
                                  may_wait=may_wait))[2]

    async def nack(self, job_id: Any, error: Any = None, requeue: Any = False, *, may_wait: float = 0.0) -> dict:
        """The job's record as stored once failed, or released with `requeue` (attempts.nack_answer)."""
        def move(job: Job) -> Job:
            now = self.clock()
            return moves.released(job, now, error) if requeue is True else moves.failed(job, now, error, self.rng)
        return (await self.change(job_id, move, may_wait=may_wait))[2]

    # ---- timers, as they fire ---------------------------------------------------------------------

    async def fire(self, fired: Fired) -> bool:
        """A job's timer came due (to this server alone): move the job if the timer still applies. False when
        the change it was armed for is not stored yet (armed first), or its move lost a compare-and-set: it
        comes again, and is decided then on the job as it is."""
        held = await self.store.get(fired.key.rsplit(".", 1)[-1])
        attempt = fired.token.get("attempt")
        if held is None:
            return fired.kind not in ("scheduled", "expire")  # a push not stored yet, or never
        job, revision = from_record(held.record), held.revision
        if (fired.kind == "retry" and job.state == State.ACTIVE and job.attempt == attempt) or \
                (fired.kind == "timeout" and job.state == State.AVAILABLE and job.attempt + 1 == attempt):
            return False  # the failure, or the claim, not stored yet
        return attempt != job.attempt or await self._due(fired.kind, job, revision)

    async def _due(self, kind: str, job: Job, revision: int) -> bool:
        now = self.clock()
        try:
            if kind in ("scheduled", "retry") and job.state in (State.SCHEDULED, State.RETRYABLE):
                await self._store(moves.due(job, now, self.count_claims_later), revision, job)
            elif kind == "expire" and job.state in WAITING:
                await self._store(moves.expired(job, now), revision, job)
            elif kind == "timeout" and job.state == State.ACTIVE:
                error = {"code": "timeout", "type": "timeout", "message": f"exceeded timeout_ms={job.timeout_ms}"}
                await self._store(moves.failed(job, now, error, self.rng), revision, job)
        except OjsError:  # it lost to a change made since it was read (Lost): decided again on the job as it is then
            return False
        return True
