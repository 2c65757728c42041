"""Job counts per queue and state, kept exact by the commits that change them (no I/O here).

Every count a server shows (OJS queue stats, the admin API, the console) is a sum of tally
records. Each change of a job's state moves its counts in the same atomic commit as the job's
record (seamq.jobs.tallied), so a count equals a scan of the jobs after any sequence of retries,
cancels, lease expiries or server kills: a commit is stored whole or not at all. Before, finishes
were appended to a log and running jobs read from the ready order's held entries; a job retried
and finished again counted twice, and an entry outliving its job counted as running.

A queue's counts are spread over a few tally records (seamq.jobs.tallied says how they are
written); a count is the sum over them. A job server's ack is one plain write that leaves the job
counted where it was (`_counted`) and bears a mark: its process's epoch and a number. The process then
moves the counts of many acks in one atomic batch with its marks record, which says the numbers up to
`upto` (but those in `skip`) are counted where their records are: so a finished record need not be
written again for its count to move, and a scan that reads the marks records counts as the tallies
do (seamq.jobs.recounts). Finished jobs are counted per hour of finishing, and a
finished job's record is kept until its hour leaves the retention period (`ttl`), so its
count and its record end together.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from seamq.jobs import tenants
from seamq.jobs.model import FINISHED, STATES, Record, parse_time

RETENTION = timedelta(days=7)
SLOTS = 16  # tally records per queue, whatever the number of servers and however often they restart
HOUR = "%Y%m%d%H"

MARKS = "marks."  # the marks records' keys: `marks.<epoch>`
MARKS_TTL = RETENTION + timedelta(days=1)  # past the last record that may bear one of its marks

Place = tuple[str, str, str]  # (queue, state, hour finished or "")
Move = tuple[str, str, str, int]  # a place and +1 or -1
Marks = dict[str, Record]  # epoch -> its marks record, as read


def prefix(queue: str) -> str:
    """Keys of a queue's tallies: the queue as one token (its dots made `=`, which no name has)."""
    return f"tally.{queue.replace('.', '=')}."


def key(queue: str, slot: int) -> str:
    return f"{prefix(queue)}{slot}"


def keys(queue: str) -> list[str]:
    """Every tally record a queue may have: its counts are their sum."""
    return [key(queue, slot) for slot in range(SLOTS)]


def place(record: Record | None, marks: Marks | None = None) -> Place | None:
    """Where a job record counts; None for no record (not yet created, or deleted). A claim may leave
    its count where it was until the job's next write (`_counted`, seamq.jobs.job.claimed); an ack
    until its mark is counted (`marks`: its epoch's record, as read; none read, none counted)."""
    if record is None:
        return None
    counted_as = record.get("_counted")
    if counted_as and not covered(record.get("_mark"), marks):
        return record["queue"], counted_as, ""
    state, at = record["state"], record.get(f"{record['state']}_at")
    return record["queue"], state, (_hour(at) if state in FINISHED and at else "")


def covered(mark: list[Any] | None, marks: Marks | None) -> bool:
    """Whether the mark's process has counted its record where it is: once so, for good (a number is
    put in `skip` only while not yet counted, by whoever moves its count instead)."""
    if not mark or not marks or (held := marks.get(mark[0])) is None:
        return False
    return bool(mark[1] <= held["upto"] and mark[1] not in held["skip"])


def marks_key(epoch: str) -> str:
    return f"{MARKS}{epoch}"


def marks_record(epoch: str, upto: int, skip: list[int]) -> Record:
    return {"_kind": "marks", "epoch": epoch, "upto": upto, "skip": sorted(set(skip))}


def marks_of(records: list[Record]) -> Marks:
    """The marks records among `records` (a scan of `MARKS`), by epoch: what `place` reads."""
    return {record["epoch"]: record for record in records if record.get("_kind") == "marks"}


def moves(before: Record | None, after: Record | None, marks: Marks | None = None) -> list[Move]:
    """What a write of `after` over `before` does to the counts: its queue's, and its tenant's in the
    queue (tallied as a queue of its own name, seamq.jobs.tenants.tally_queue)."""
    old, new = place(before, marks), place(after, marks)
    if old == new:
        return []
    out = [*([(*old, -1)] if old else []), *([(*new, 1)] if new else [])]
    return out + [(tenants.tally_queue(queue, tenant), state, hour, delta) for (queue, state, hour, delta), tenant
                  in zip(out, [tenants.of(before)] * bool(old) + [tenants.of(after)] * bool(new)) if tenant]


def applied(record: Record | None, queue: str, lane_moves: list[Move], now: datetime) -> Record:
    """A lane's tally of `queue` with `lane_moves` added; hours past retention dropped (their jobs'
    records are gone), and zeros."""
    live = dict((record or {}).get("live", {}))
    done = {hour: dict(states) for hour, states in (record or {}).get("done", {}).items() if not _expired(hour, now)}
    for _, state, hour, delta in lane_moves:
        counts = done.setdefault(hour, {}) if state in FINISHED else live
        counts[state] = counts.get(state, 0) + delta
    done = {hour: {s: n for s, n in states.items() if n} for hour, states in done.items()}
    return {"_kind": "tally", "queue": queue, "live": {s: n for s, n in live.items() if n},
            "done": {hour: states for hour, states in done.items() if states}}


def summed(records: list[Record], now: datetime) -> dict[str, int]:
    """A queue's count of each state, from every lane's tally."""
    out: dict[str, int] = dict.fromkeys(STATES, 0)
    for record in records:
        for state, n in record.get("live", {}).items():
            out[state] += n
        for hour, states in record.get("done", {}).items():
            if not _expired(hour, now):
                for state, n in states.items():
                    out[state] += n
    return out


def counting(record: Record) -> list[Move]:
    """The moves that count a marked record where it is, from where its write left it."""
    return moves(record, {key: value for key, value in record.items() if key != "_counted"})


def ttl(key: str, record: Record, now: datetime) -> int:
    """Seconds a finished record is kept: a job's until its hour leaves the retention period (where
    it counts once counted: an ack's, whose record is not written again), a marks record past the
    last job that may bear its marks, any other for the retention period."""
    if key.startswith(MARKS):
        return int(MARKS_TTL.total_seconds())
    state, at = record.get("state"), record.get(f"{record.get('state')}_at")
    if "." in key or state not in FINISHED or not at:
        return int(RETENTION.total_seconds())
    return max(1, int((_kept_until(_hour(at)) - now).total_seconds()))


def _hour(at: str) -> str:
    if len(at) == 24 and at[-1] == "Z":  # as this server writes times (seamq.jobs.model.iso): read, not parsed
        return at[0:4] + at[5:7] + at[8:10] + at[11:13]
    return parse_time(at).astimezone(timezone.utc).strftime(HOUR)


@lru_cache(maxsize=512)  # a few hours are live at a time; each finished job asks
def _kept_until(hour: str) -> datetime:
    return datetime.strptime(hour, HOUR).replace(tzinfo=timezone.utc) + timedelta(hours=1) + RETENTION


def _expired(hour: str, now: datetime) -> bool:
    return bool(hour) and _kept_until(hour) <= now
