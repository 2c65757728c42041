"""The job store as the engine sees it: a port that a NATS store and an in-memory store both implement,
and that one contract suite (tests/test_jobs_store_contract.py) holds both to, as River's drivers.

Three parts, none of which keeps the whole backlog in a server's memory:
- records, the truth: a dict per key with a revision; writes are compare-and-set, several at once
  all or none;
- the ready order: an entry per job that became available, taken by priority then first in, first
  out, and held while its job runs (the hold is the job's lease: it comes back to be taken again if
  not settled in time, whichever server took it and whether or not that server still runs);
- timers: (kind, key) fires once at its time; a new one for the same kind and key replaces it.

An entry or a timer may be stale (its job moved on since): the engine checks each against the
record, by revision or attempt, and drops what no longer applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class Conflict(Exception):
    """A compare-and-set lost: someone else changed the record (or created the key) first."""


@dataclass(frozen=True)
class Write:
    """One record to store: `revision` 0 creates the key (refused if it exists), else a CAS on it.
    A `finished` record is kept for the retention period only."""

    key: str
    record: dict
    revision: int = 0
    finished: bool = False


@dataclass(frozen=True)
class Taken:
    """A ready entry, held: `job_id` at the `revision` that made it available; `hold` names the hold,
    for any server to extend or settle (it is kept in the job's record)."""

    job_id: str
    revision: int
    entry: str  # the entry's own id, the same each time it comes
    hold: str  # this delivery's hold
    deliveries: int  # 1 the first time; more when a hold ran out and it came again
    record: dict | None = None  # the record as offered, so a claim needs no read (its CAS checks it)


@dataclass(frozen=True)
class Fired:
    kind: str
    key: str
    token: dict
    handle: object


class JobStore(Protocol):
    async def get(self, key: str) -> tuple[dict, int] | None: ...

    async def commit(self, writes: list[Write]) -> list[int]:
        """All the writes or none; the new revisions, in order. Raises Conflict."""

    async def delete(self, key: str) -> None: ...

    async def offer(self, queue: str, priority: int, job_id: str, revision: int, record: dict | None = None) -> None:
        """`job_id` became available at `revision` (as `record`): an entry for its queue's order."""

    async def take(self, queue: str, count: int, hold_seconds: float) -> list[Taken]:
        """Up to `count` entries of `queue`, highest priority first, then in the order offered; each
        held for `hold_seconds`, then offered again unless settled."""

    async def hold(self, hold: str, seconds: float) -> None:
        """Extend a hold (a heartbeat): it now ends `seconds` from now."""

    async def settle(self, hold: str) -> None:
        """The entry is done with (its job finished, failed or moved on): it never comes again."""

    async def waiting(self, queue: str) -> dict[int, int]:
        """Entries not yet settled (held ones too), by priority."""

    async def arm(self, kind: str, key: str, at: datetime, token: dict) -> None: ...

    async def disarm(self, kind: str, key: str) -> None: ...

    async def fired(self, batch: int, timeout: float) -> list[Fired]:
        """Timers whose time has come, each handed to one server until `done`."""

    async def done(self, fired: Fired) -> None: ...
