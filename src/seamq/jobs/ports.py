"""The job store as the engine sees it: a port that a NATS store and an in-memory store both implement,
and that one contract suite (tests/contracts/jobs/test_jobs_store_contract.py) holds both to, as River's drivers.

Three parts, none of which keeps the whole backlog in a server's memory:
- records, the truth: a dict per key with a revision (`Stored`); writes are compare-and-set, several at once
  all or none;
- the ready order: an entry per job that became available (offered before its record is stored),
  taken by priority then first in, first out, and held while its job runs (the hold is the job's lease: it comes back to be taken again if
  not settled in time, whichever server took it and whether or not that server still runs);
- timers: (kind, key) fires once at its time; a new one for the same kind and key replaces it.

An entry or a timer may be stale (its job moved on since): the engine checks each against the
record as last stored (`get`), by revision or attempt, and drops what no longer applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import AsyncIterator, NamedTuple, Protocol

from seamq.jobs.model import Record


# How long an entry taken is held before it comes again, unless held anew: long enough for a server
# to claim its job, short enough that one killed meanwhile delays the job by no more (kill -9
# mid-fetch). Most jobs end within it, so their entries need no other hold.
TAKEN_HOLD = 30
# A change whose compare-and-set lost to another writer (a heartbeat, a timer, another job of its
# workflow) is read again and tried again, this many times in all, before it is refused as a conflict.
CAS_TRIES = 8

class Stored(NamedTuple):
    """A record as last stored, and the revision a compare-and-set over it names."""

    record: Record
    revision: int


class Conflict(Exception):
    """A compare-and-set lost: someone else changed the record (or created the key) first."""


@dataclass(frozen=True)
class Write:
    """One record to store: `revision` 0 creates the key (refused if it exists), None writes it
    whatever is there, else a CAS on it; `record` None deletes the key. A `finished` record is kept
    for the retention period only. A job's write names where the record it replaces (as read at
    `revision`) counts (`before`, seamq.jobs.job.counted): its counts move with it (seamq.jobs.tally).
    A store that gathers writes into batches may hold one for up to `may_wait` seconds, for others to
    share its batch (a worker's ack, which nobody waits on, rides with the next fetch's claims).
    `moves`: counts moved with it besides its record's own (a marks record's: seamq.jobs.recounts)."""

    key: str
    record: Record | None
    revision: int | None = 0
    finished: bool = False
    before: Record | None = None
    may_wait: float = 0.0
    moves: tuple[tuple[str, str, str, int], ...] = ()


@dataclass(frozen=True)
class Taken:
    """A ready entry, held: `hold` names the hold, for any server to extend or settle (it is kept in
    the job's record)."""

    job_id: str
    entry: str  # the entry's own id, the same each time it comes
    hold: str  # this delivery's hold
    deliveries: int  # 1 the first time; more when a hold ran out and it came again


@dataclass(frozen=True)
class Fired:
    kind: str
    key: str
    token: Record
    handle: object
    deliveries: int = 1  # how many times it was handed out


class JobStore(Protocol):
    async def get(self, key: str) -> Stored | None:
        """The record as last stored (read your writes): what a refusal or a dropped entry is decided on."""

    async def get_many(self, keys: list[str]) -> dict[str, Stored]:
        """Several records in one read: those that exist, by key. Cheaper than `get`, and possibly
        older than the last write (a replica may answer): a hint to act on, checked by CAS, never a
        reason to refuse or to drop anything."""

    async def commit(self, writes: list[Write]) -> list[int]:
        """All the writes or none; the new revisions, in order. Raises Conflict."""

    async def commit_each(self, commits: list[list[Write]]) -> list[list[int] | BaseException]:
        """Several commits, each all or nothing on its own, sent together (a fetch's claims, a worker's
        acks): the outcome of each, its revisions or the error `commit` would raise (a Conflict its own)."""

    async def landed(self, key: str) -> None:
        """Once every commit writing `key` that this process has on its way is answered, stored or not
        (a fetch that met an entry before its record waits for the record, not for the entry's hold).
        A store that answers each commit to its caller has none on its way."""

    async def delete(self, key: str) -> None: ...

    async def scan(self, prefix: str) -> list[Stored]:
        """Every record whose key starts with `prefix` (a dotted one such as `cron.`; "" for the jobs,
        whose keys have no dot): a pass over the store, for listings, never kept."""

    def follow(self, prefixes: list[str]) -> "AsyncIterator[tuple[str, Record | None]]":
        """Every record under `prefixes` as it is now, then ("", None), then each change as it happens
        (None: deleted). For the few records every server needs at hand: queue flags, limits, schemas,
        crons."""

    async def offer(self, queue: str, priority: int, job_id: str, tenant: str = "") -> None:
        """The job becomes available: an entry for its queue's order, offered before the record that
        says so is stored (a server that dies between the two leaves an entry, never a job without one).
        A queue's entries are kept in a lane per tenant ("" for jobs of none)."""

    async def withdraw(self, queue: str, priority: int, job_id: str, tenant: str = "") -> None:
        """The job will not run (cancelled or expired while it waited): its entry goes."""

    async def take(self, queue: str, count: int, tenant: str | None = None) -> list[Taken]:
        """Up to `count` entries of `queue`, highest priority first, then in the order offered within
        a lane; each held for TAKEN_HOLD seconds, then offered again unless settled or held anew
        (`hold`). `tenant` takes from its lane alone; None from every lane of a priority in turn, each
        lane with entries given a share of the count (so a tenant with many jobs waiting does not
        hold back one with few), the lane served first moving on at each take."""

    async def hold(self, hold: str, seconds: float) -> None:
        """Extend a hold (a heartbeat): it now ends `seconds` from now."""

    async def settle(self, hold: str) -> None:
        """The entry is done with (its job finished, failed or moved on): it never comes again."""

    async def waiting(self, queue: str) -> dict[int, int]:
        """Entries not yet settled (held ones too), by priority."""

    async def queues(self) -> list[str]:
        """The queues that were offered entries (their ready orders)."""

    async def ready_counts(self, queue: str) -> tuple[int, int]:
        """(entries waiting to be taken, entries held) of `queue`."""

    async def arm(self, kind: str, key: str, at: datetime, token: Record) -> None: ...

    async def disarm(self, kind: str, key: str) -> None: ...

    async def fired(self, batch: int, timeout: float) -> list[Fired]:
        """Timers whose time has come, each handed to one server until `done`."""

    async def done(self, fired: Fired) -> None: ...

    async def again(self, fired: Fired, seconds: float) -> None:
        """Hand the timer out again in `seconds` (it came before the change it was armed for was stored)."""

    # ---- intake: jobs relayed from outboxes (seamq.jobs.intake) ---------------------------------------

    async def taken_in(self, batch: int = 100, timeout: float = 1.0) -> list[tuple[bytes, object]]:
        """(push body as the relay sent it, a handle) of up to `batch` relayed jobs, waiting up to
        `timeout` seconds for one; each handed to one server until `intake_done`, and again if it never
        says so."""

    async def later(self, handle: object, delay: float) -> None:
        """Hand the relayed job out again in `delay` seconds (a transient failure)."""

    async def intake_done(self, handle: object) -> None: ...

    # ---- the event log: batches of events, from every server ------------------------------------------

    async def log(self, batch: bytes) -> int:
        """Append a batch; its sequence (the last 10,000 batches are kept)."""

    async def logged(self, after: int, most: int) -> list[tuple[int, bytes]]:
        """(sequence, batch) of up to `most` batches after sequence `after`, oldest first."""

    async def log_bounds(self) -> tuple[int, int]:
        """The first and last sequence kept ((0, 0) when none is)."""

    # ---- unique locks --------------------------------------------------------------------------------

    async def lock_unique(self, fingerprint: str, job_id: str, period: float | None) -> str | None:
        """Take the lock for `job_id`: None, or the job id that holds it."""

    async def take_unique(self, fingerprint: str, job_id: str, period: float | None) -> None:
        """Give the lock to `job_id` whoever holds it."""

    def reachable(self) -> bool:
        """Whether the store can be asked now (the readiness a load balancer probes)."""

    async def wipe(self) -> None:
        """Empty the store (test mode's reset)."""

    async def close(self) -> None: ...


class WorkflowMoves(Protocol):
    """What a job's end asks of its workflow: seamq.jobs.flows, which the engine gives the operations
    (named here so that neither imports the other)."""

    async def ending(self, record: Record) -> tuple[list[Write], list[Record], Record | None]:
        """The writes to commit with the job's end, the jobs they create, the workflow's new record."""

    async def ended(self, moved: Record | None) -> None: ...


@dataclass(frozen=True)
class EventBatch:
    """A batch of the event log as stored (seamq.jobs.events reads it), and how to say it is done."""
    handle: object
    seq: int
    data: bytes


@dataclass(frozen=True)
class Delivery:
    """A webhook delivery waiting its turn: what to send (seamq.jobs.hooks), and its attempt (1 first)."""
    handle: object
    data: bytes
    attempt: int


class HookQueue(Protocol):
    """Webhook deliveries (seamq.jobs.nats_hooks): the event log read once by all servers together,
    and a queue of deliveries, each held by one server at a time."""

    async def batches(self, most: int, timeout: float) -> list[EventBatch]: ...

    async def queue(self, delivery_id: str, sub_id: str, payload: bytes) -> None:
        """A delivery to make; the same id queued again is one delivery."""

    async def deliveries(self, most: int, timeout: float) -> list[Delivery]: ...

    async def done(self, handle: object) -> None:
        """A batch turned into deliveries, or a delivery made: it never comes again."""

    async def again(self, handle: object, seconds: float) -> None: ...

    async def dropped(self, handle: object) -> None:
        """A delivery that will not be tried again (dead, or its subscription gone)."""


class Post(Protocol):
    """An HTTP POST (seamq.jobs.poster): the answer's status, or None and why there was none."""

    async def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str | None]: ...
