"""A job as the engine reasons about it: a typed, immutable record whose every state change is one
named function (River's `JobRow` and its `JobSetState...` constructors are the example), with times
as datetimes inside and ISO strings only at the edge (`from_record`, `to_record`).

No I/O: the engine loads a record, asks one of these for the next one, and stores it with a
compare-and-set. A transition checks the state it starts from and refuses any other with 409, so a
rule about which move is allowed from where is stated here once. `timers` says which clocks a job
needs in its state, for the engine to arm.
"""

from __future__ import annotations

import random
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from seamq.jobs.attempts import error_entry
from seamq.jobs.model import FINISHED, WAITING, Record, RetryPolicy, State, conflict, iso, parse_time, visibility_ms
from seamq.jobs.model import public as model_public

RECORD_TTL = timedelta(days=7)  # a finished job is kept this long (the store's per-message TTL)


TIMES = ("created_at", "enqueued_at", "scheduled_at", "started_at", "completed_at", "cancelled_at", "discarded_at",
         "next_attempt_at", "lease_until")
INTERNAL = {"lease_until": "_lease_until", "dead_letter": "_dlq", "entry": "_entry", "hold": "_hold",
            "counted_as": "_counted", "mark": "_mark"}  # never shown
ALWAYS = ("enqueued_at", "scheduled_at", "expires_at", "timeout_ms", "tags", "retry", "unique", "options")


@dataclass(frozen=True)
class Job:
    id: str
    type: str
    queue: str
    args: list[Any]
    state: State
    created_at: datetime
    priority: int = 0
    attempt: int = 0
    max_attempts: int = 3
    enqueued_at: datetime | None = None
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    cancelled_at: datetime | None = None
    discarded_at: datetime | None = None
    next_attempt_at: datetime | None = None
    lease_until: datetime | None = None
    expires_at: str | None = None  # as the client sent it (echoed exactly); `expires` reads it
    timeout_ms: int | None = None
    tags: list[str] | None = None
    retry: dict[str, Any] | None = None
    unique: dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    worker_id: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    errors: tuple[dict[str, Any], ...] = ()
    retry_delay_ms: int | None = None
    dead_letter: bool = False
    workflow_id: str | None = None
    workflow_index: int | None = None
    entry: str | None = None  # the ready entry (and its hold) that this attempt runs under
    hold: str | None = None
    parent_results: list[Any] | None = None
    # The state its queue's counts still show it in, when not its own: a claim, an ack or a timer's move
    # that leaves its count to later (`count_later`, seamq.jobs.recounts). Every other change clears it.
    counted_as: str | None = None
    # An ack's `counted_as` holds until its process counts this mark, [epoch, number] (seamq.jobs.recounts).
    mark: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what else the client sent (specversion, schema, ...)
    # Its fields and its record as read from the store: to_record writes only what changed since.
    as_read: tuple[Record, Record] | None = field(default=None, compare=False, repr=False)

    @property
    def expires(self) -> datetime | None:
        return parse_time(self.expires_at) if self.expires_at else None

    @property
    def ended_at(self) -> datetime | None:
        return self.completed_at or self.discarded_at or self.cancelled_at

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy.from_options(self.retry, self.max_attempts)


_FIELDS = {f.name for f in fields(Job)} - {"extra", "as_read"}
_STORED = {INTERNAL.get(name, name): name for name in _FIELDS}
_ORDER = tuple(dict.fromkeys(("id", "type", "queue", "args", "priority", "state", "attempt", "max_attempts", *ALWAYS,
                              *sorted(_FIELDS))))
_KINDS = {**{name: "time" for name in TIMES}, "state": "state", "errors": "errors", "dead_letter": "flag"}
_SPEC = tuple((name, INTERNAL.get(name, name), _KINDS.get(name), name in ALWAYS) for name in _ORDER)
_NAMES = frozenset(f.name for f in fields(Job)) - {"as_read"}
_SET = object.__setattr__
_DEFAULTS = {f.name: f.default for f in fields(Job) if f.default is not MISSING}
_REQUIRED = frozenset(f.name for f in fields(Job) if f.default is MISSING and f.default_factory is MISSING)


def replace(job: Job, **changes: Any) -> Job:
    """dataclasses.replace as one merge of the fields (two calls per job processed; docs/benchmarks.md 7k).
    A changed job is counted where its state is, unless the change says otherwise (`counted_as`)."""
    if not changes.keys() <= _NAMES:
        raise TypeError(f"Job has no field {sorted(changes.keys() - _NAMES)}")
    new = object.__new__(Job)
    _SET(new, "__dict__", {**job.__dict__, "counted_as": None, "mark": None, **changes})
    return new


def from_record(record: Record) -> Job:
    """The stored dict (ISO strings, `_lease_until`, `_dlq`) as a Job, made without the frozen
    dataclass's __init__, which sets each of its fields through object.__setattr__."""
    known, extra = dict(_DEFAULTS), {}
    for key, value in record.items():
        name = _STORED.get(key)
        if name is None:
            extra[key] = value
        elif name in TIMES:
            known[name] = parse_time(value) if value else None
        else:
            known[name] = value
    if not _REQUIRED <= known.keys():
        raise ValueError(f"a stored job without {sorted(_REQUIRED - known.keys())}")
    known["state"] = State(known["state"])
    known["errors"] = tuple(known["errors"] or ())
    known["dead_letter"] = bool(known["dead_letter"])
    known["extra"] = extra
    known["as_read"] = (dict(known), dict(record))
    job = object.__new__(Job)
    _SET(job, "__dict__", known)
    return job


_ISO: dict[datetime, str] = {}  # times formatted once: a job's are written again at each of its changes


def _iso(moment: datetime) -> str:
    text = _ISO.get(moment)
    if text is None:
        if len(_ISO) >= 4096:
            _ISO.clear()
        text = _ISO[moment] = iso(moment)
    return text


def counted(job: Job) -> Record:
    """Where the job's record counts, and no more of it (seamq.jobs.tally.place): what a write names
    as the record it replaces."""
    if job.mark:  # counted where it is once its mark is (seamq.jobs.tally.place)
        state, at = job.state.value, getattr(job, f"{job.state.value}_at")
        out = {"queue": job.queue, "state": state, f"{state}_at": _iso(at), "_counted": job.counted_as, "_mark": job.mark}
    else:
        state = job.counted_as or job.state.value
        at = getattr(job, f"{state}_at") if job.state in FINISHED and not job.counted_as else None
        out = {"queue": job.queue, "state": state, f"{state}_at": _iso(at)} if at else {"queue": job.queue, "state": state}
    tenant = (job.meta or {}).get("tenant_id")
    return {**out, "meta": {"tenant_id": tenant}} if tenant else out  # its tenant's counts move too


_NOTHING: Any = {}  # no fields as read: a value is never this very object, so every field is written


def to_record(job: Job) -> Record:
    """The dict to store: the client's other fields, then every field (ISO strings for times). A job
    read from the store starts from the record it was read as, and writes only the fields that changed."""
    values = job.__dict__
    read = values["as_read"]
    if read is None or job.extra is not read[0]["extra"]:
        was, record = _NOTHING, dict(job.extra)
    else:
        was, record = read[0], dict(read[1])
    for name, key, kind, always in _SPEC:
        value = values[name]
        if value is was.get(name, _NOTHING):
            continue
        if value is None or (kind in ("flag", "errors") and not value):
            if always:
                record[key] = None
            else:
                record.pop(key, None)
            continue
        record[key] = _iso(value) if kind == "time" else value.value if kind == "state" else \
            list(value) if kind == "errors" else value
    return record


def public(job: Job) -> Record:
    """What a client sees (seamq.jobs.model.public says what is left out)."""
    return model_public(to_record(job))


# ---- transitions: one function per move, each refusing the states it does not start from -----------

def _from(job: Job, allowed: frozenset[State] | set[State], what: str) -> None:
    if job.state not in allowed:
        raise conflict(f"cannot {what} job {job.id}: it is {job.state.value}")


def claimed(job: Job, now: datetime, worker_id: str | None, lease: timedelta, entry: str | None = None,
            hold: str | None = None, count_later: bool = False) -> Job:
    """`count_later`: its queue's counts keep it where it was (available, or where its coming due left
    it) until its next change or its recount (seamq.jobs.recounts): the claim is one write, no count moved."""
    _from(job, {State.AVAILABLE}, "claim")
    return replace(job, state=State.ACTIVE, attempt=job.attempt + 1, started_at=now, worker_id=worker_id,
                   lease_until=now + lease, entry=entry, hold=hold,
                   counted_as=(job.counted_as or State.AVAILABLE.value) if count_later else None)


def marked(job: Job, mark: list[Any]) -> Job:
    """An ack that counts later, bearing the number its process counts it by (seamq.jobs.recounts)."""
    if job.counted_as is None or job.state not in FINISHED:
        raise conflict(f"cannot mark job {job.id}: it is counted as {job.state.value}")
    return replace(job, counted_as=job.counted_as, mark=mark)


def recounted(job: Job) -> Job:
    """A job whose change was stored with `count_later`: counted where it is from now on."""
    if job.counted_as is None:
        raise conflict(f"cannot recount job {job.id}: it is counted as {job.state.value}")
    return replace(job)


def extended(job: Job, now: datetime, lease: timedelta) -> Job:
    _from(job, {State.ACTIVE}, "extend the lease of")
    return replace(job, lease_until=now + lease)


def completed(job: Job, now: datetime, result: Any, count_later: bool = False) -> Job:
    """`count_later`: its queue's counts keep it where it was until it is recounted (seamq.jobs.recounts);
    not a workflow's step, whose end is one atomic batch with its workflow's records anyway."""
    _from(job, {State.ACTIVE}, "acknowledge")
    later = count_later and job.workflow_id is None
    return replace(job, state=State.COMPLETED, completed_at=now, result=result, error=None, lease_until=None,
                   entry=None, hold=None, counted_as=(job.counted_as or job.state.value) if later else None)


def failed(job: Job, now: datetime, error: Any, rng: random.Random | None = None) -> Job:
    """An attempt failed (nack, timeout): retryable after the policy's delay, or discarded (and kept
    as a dead letter with `on_exhaustion: dead_letter`) when hopeless or out of attempts."""
    _from(job, {State.ACTIVE}, "fail")
    entry = error_entry(error, job.attempt, now)
    common = dict(error=_last(entry), errors=(*job.errors, entry), lease_until=None, worker_id=None, entry=None,
                  hold=None)
    policy = job.policy
    names = [entry["type"], entry["code"]]
    if isinstance((entry.get("details") or {}).get("error_class"), str):
        names.append(entry["details"]["error_class"])
    if not entry["retryable"] or policy.matches_non_retryable(names) or job.attempt >= policy.max_attempts:
        return replace(job, **common, state=State.DISCARDED, completed_at=now, discarded_at=now,
                       dead_letter=policy.on_exhaustion == "dead_letter")
    delay = policy.delay(job.attempt, rng)
    return replace(job, **common, state=State.RETRYABLE, retry_delay_ms=round(delay * 1000),
                   next_attempt_at=now + timedelta(seconds=delay))


def released(job: Job, now: datetime, error: Any) -> Job:
    """An attempt ended without a verdict (a nack with `requeue`, a lease that ran out, a worker
    stopped or deregistered): back in the queue now, the attempt kept in its history."""
    _from(job, {State.ACTIVE}, "release")
    entry = error_entry(error, job.attempt, now)
    return replace(job, state=State.AVAILABLE, enqueued_at=now, error=_last(entry), errors=(*job.errors, entry),
                   lease_until=None, worker_id=None, entry=None, hold=None)


def lease_expired(job: Job, now: datetime) -> Job:
    """No ack, nack or heartbeat within the lease: released, the attempt kept as `lease_expired`."""
    return released(job, now, {"code": "lease_expired", "type": "LeaseExpired", "message": f"worker {job.worker_id or '?'} "
                               "sent no ack, nack or heartbeat within the visibility timeout: the job went back to its queue"})


def lease(job: Job, visibility: Any) -> timedelta:
    """How long a claim holds the job: the fetch's visibility timeout, else the job's, else the default."""
    return timedelta(milliseconds=visibility_ms({"options": job.options}, visibility))


def cancelled(job: Job, now: datetime) -> Job:
    if job.state in FINISHED:
        raise conflict(f"job {job.id} is {job.state.value}: it can no longer be cancelled")
    return replace(job, state=State.CANCELLED, cancelled_at=now, lease_until=None, entry=None, hold=None)


def expired(job: Job, now: datetime) -> Job:
    _from(job, WAITING, "expire")
    return replace(job, state=State.DISCARDED, discarded_at=now)


def deferred(job: Job, until: datetime) -> Job:
    """Its rate limit key lets it start no sooner than `until`, and its policy says reschedule."""
    _from(job, {State.AVAILABLE}, "reschedule")
    return replace(job, state=State.SCHEDULED, scheduled_at=until)


def dropped(job: Job, now: datetime, error: dict[str, Any]) -> Job:
    """Its rate limit key does not let it start, and its policy says drop: discarded, saying why."""
    _from(job, {State.AVAILABLE}, "drop")
    entry = error_entry(error, job.attempt, now)
    return replace(job, state=State.DISCARDED, discarded_at=now, error=_last(entry), errors=(*job.errors, entry))


def due(job: Job, now: datetime, count_later: bool = False) -> Job:
    """A scheduled job's time, or a retry's, has come. `count_later`: counted as scheduled (or retryable)
    until recounted, so that the fetch waiting for it waits for one plain write."""
    _from(job, {State.SCHEDULED, State.RETRYABLE}, "make available")
    return replace(job, state=State.AVAILABLE, enqueued_at=now,
                   counted_as=(job.counted_as or job.state.value) if count_later else None)


def retried(job: Job, now: datetime) -> Job:
    """An operator runs a discarded or cancelled job again: attempt 0, its errors kept as history."""
    if job.state not in (State.DISCARDED, State.CANCELLED):
        raise conflict(f"job {job.id} is {job.state.value}: only discarded or cancelled jobs can be retried")
    return replace(job, state=State.AVAILABLE, attempt=0, enqueued_at=now, dead_letter=False, error=None,
                   completed_at=None, discarded_at=None, cancelled_at=None)


def _last(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("code", "type", "message", "retryable", "details", "rate_limit_until") if k in entry}


# ---- clocks ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Timer:
    kind: str  # run (scheduled or retry due), expire, lease, timeout, forget
    at: datetime
    attempt: int  # the attempt it was armed for: a timer of an earlier one changes nothing


def timer_key(job: Job) -> str:
    """A job's timers are keyed by queue, then id: a queue's counts are those of its keys."""
    return f"{job.queue}.{job.id}"


def timers(job: Job) -> list[Timer]:
    """The clocks a job needs in its state."""
    out = []
    if job.state == State.SCHEDULED and job.scheduled_at:
        out.append(Timer("run", job.scheduled_at, job.attempt))
    if job.state == State.RETRYABLE and job.next_attempt_at:
        out.append(Timer("run", job.next_attempt_at, job.attempt))
    if job.state in WAITING and (expires := job.expires):
        out.append(Timer("expire", expires, job.attempt))
    if job.state == State.ACTIVE:
        if job.lease_until:
            out.append(Timer("lease", job.lease_until, job.attempt))
        if job.timeout_ms and job.started_at:
            out.append(Timer("timeout", job.started_at + timedelta(milliseconds=job.timeout_ms), job.attempt))
    if job.state in FINISHED and job.ended_at:
        out.append(Timer("forget", job.ended_at + RECORD_TTL, job.attempt))
    return out


@dataclass(frozen=True, slots=True)
class Aftermath:
    """What a stored state change leaves to do once its write is in: what the job's old state held
    that its new one does not (seamq.jobs.admission lets it go, in this order), what its end asks of
    its workflow and of the dead letters, and the event it is told as."""

    settle: str | None = None  # the hold its run was fetched under: its entry is done with
    withdraw: bool = False  # it ended while waiting in its queue's ready order
    disarm: str | None = None  # the count of the timer it no longer waits for: "scheduled" or "retry"
    finished: bool = False  # it ended: its queue counts one more finished job of its state
    workflow: bool = False  # it ended in a workflow: the workflow's next step is written with it
    dead_letter: bool = False  # it was discarded for good and kept as a dead letter, written with it
    release: bool = False  # it stopped running: the permit of its rate limit key goes back (seamq.jobs.limiter)
    event: str | None = None  # what the event log says of it


def aftermath(before: Job, job: Job) -> Aftermath:
    """What storing `job` over `before`, the job as it was read, leaves to do."""
    finished = job.state in FINISHED
    waited = {State.SCHEDULED: "scheduled", State.RETRYABLE: "retry"}.get(before.state)
    return Aftermath(settle=before.hold if before.hold and before.hold != job.hold else None,
                     withdraw=finished and before.state == State.AVAILABLE,
                     disarm=waited if finished else None, finished=finished,
                     workflow=finished and job.workflow_id is not None,
                     dead_letter=job.dead_letter and job.state == State.DISCARDED,
                     release=before.state == State.ACTIVE and job.state != State.ACTIVE,
                     event=_event(before, job))


def _event(before: Job, job: Job) -> str | None:
    if job.state == State.ACTIVE:
        return "job.started" if job.attempt > before.attempt else None  # a claim, not a heartbeat
    if job.state == before.state:
        return None
    if job.state == State.DISCARDED:
        expired = before.state in WAITING and len(job.errors) == len(before.errors)  # dropped ones say why
        return "job.expired" if expired else "job.discarded"
    return _EVENTS.get(job.state)


_EVENTS = {State.COMPLETED: "job.completed", State.RETRYABLE: "job.retrying", State.CANCELLED: "job.cancelled"}
