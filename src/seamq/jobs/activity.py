"""What the admin API reports that no job record holds: the workers a server has heard from, and its
throughput per minute. No I/O; the engine feeds both as requests and job events pass.

Both are the view of one server process (they restart empty, and with several
servers each knows its own clients): the admin API says so in `scope`, rather
than presenting a part as the whole.
"""

from __future__ import annotations

from typing import Any, Iterable

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from seamq.jobs.model import invalid, iso

STALE_AFTER = timedelta(seconds=60)  # no fetch or heartbeat for this long: the worker is stale
FORGET_AFTER = timedelta(hours=24)
KEPT_MINUTES = 24 * 60
PERIODS = {"1m": 1, "5m": 5, "1h": 60, "1d": 1440}
KINDS = ("processed", "failed", "enqueued")
SAID = frozenset({"running", "quiet", "drain", "terminate"})  # the states a worker says of itself


@dataclass
class Worker:
    id: str
    started_at: datetime
    last_seen_at: datetime
    queues: set[str] = field(default_factory=set)
    last_heartbeat_at: datetime | None = None
    active_jobs: int = 0
    asked: str | None = None  # "quiet" or "terminate", said in its next heartbeat answer
    said: str = "running"  # what the worker said of itself in its last beat: quiet, drain, terminate

    def state(self, now: datetime) -> str:
        if self.asked:
            return self.asked
        if self.said != "running":
            return self.said
        return "stale" if now - self.last_seen_at > STALE_AFTER else "running"

    def draining(self, now: datetime) -> bool:
        """It said lately that it is quiet or draining: it is handed no new job (graceful shutdown). Said
        longer ago than STALE_AFTER, by a worker killed while it drained, it no longer holds."""
        return self.said in ("quiet", "drain") and now - (self.last_heartbeat_at or now) <= STALE_AFTER

    def public(self, now: datetime) -> dict[str, Any]:
        return {"id": self.id, "state": self.state(now), "queues": sorted(self.queues),
                "active_jobs": self.active_jobs, "started_at": iso(self.started_at),
                "last_heartbeat_at": iso(self.last_heartbeat_at or self.last_seen_at),
                "last_seen_at": iso(self.last_seen_at)}


class Workers:
    def __init__(self) -> None:
        self.known: dict[str, Worker] = {}

    def seen(self, worker_id: object, now: datetime, queues: Iterable[str] = ()) -> Worker | None:
        if not isinstance(worker_id, str) or not worker_id:
            return None  # a fetch without a worker_id is allowed; there is no one to list
        worker = self.known.get(worker_id)
        if worker is None:
            self._forget_old(now)
            worker = self.known[worker_id] = Worker(worker_id, now, now)
        worker.last_seen_at = now
        worker.queues.update(queues)
        return worker

    def heard(self, worker_id: object, shared: dict[str, Any] | None, now: datetime) -> Worker | None:
        """A worker as this server knows it, with what it said through another server (`shared`, the
        record every server follows: seamq.jobs.queues.say) when that is newer."""
        worker = self.known.get(worker_id) if isinstance(worker_id, str) else None
        if shared is None:
            return worker
        at = datetime.fromisoformat(shared["at"])
        if worker is None:
            worker = self.known[shared["id"]] = Worker(shared["id"], at, at)
        if worker.last_heartbeat_at is None or at > worker.last_heartbeat_at:
            worker.said, worker.last_heartbeat_at = shared["said"], at
        return worker

    def fetching(self, worker_id: object, now: datetime, queues: Iterable[str],
                 shared: dict[str, Any] | None = None) -> bool:
        """A fetch: whether the worker may be handed jobs. One that said it ended (`terminate`) and
        fetches again is a new life under the same id (a supervisor restarted it)."""
        self.heard(worker_id, shared, now)
        worker = self.seen(worker_id, now, queues)
        if worker is None:
            return True
        if worker.said == "terminate":
            worker.said = "running"
        return not worker.draining(now)

    def beat(self, worker_id: str, active_jobs: int, now: datetime, said: str | None = None) -> str | None:
        """A heartbeat, with the state the worker says it is in: returns what it was asked to do, if anything."""
        worker = self.seen(worker_id, now)
        if worker is None:  # no id: no one to list, nothing asked
            return None
        worker.last_heartbeat_at, worker.active_jobs = now, active_jobs
        if said is not None:
            if said not in SAID:
                raise invalid(f"state must be one of {', '.join(sorted(SAID))}, not {said!r}")
            worker.said = said
        return worker.asked

    def ask(self, worker_id: str, what: str) -> Worker | None:
        worker = self.known.get(worker_id)
        if worker is not None:
            worker.asked = what
        return worker

    def listing(self, now: datetime) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rows = [w.public(now) for w in sorted(self.known.values(), key=lambda w: w.id)]
        states = Counter(r["state"] for r in rows)
        return rows, {"total": len(rows), "running": states["running"], "quiet": states["quiet"],
                      "stale": states["stale"]}

    def _forget_old(self, now: datetime) -> None:
        for worker_id in [k for k, w in self.known.items() if now - w.last_seen_at > FORGET_AFTER]:
            del self.known[worker_id]


def _minute(moment: datetime) -> int:
    return int(moment.timestamp() // 60)


class Meter:
    """Jobs processed, failed and enqueued per minute and queue, for the last 24 hours. Kept by
    (queue, kind) then minute, so a rate is two lookups per queue, however long the history."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], Counter[int]] = {}  # (queue, kind) -> minute -> jobs
        self.pruned = 0  # the minute of the last pruning
        self.total: Counter[tuple[str, str]] = Counter()  # (queue, kind) -> jobs since this process started

    def count(self, kind: str, queue: str, now: datetime) -> None:
        minute = _minute(now)
        self.counts.setdefault((queue, kind), Counter())[minute] += 1
        self.total[(queue, kind)] += 1
        if minute != self.pruned:  # once a minute: drop what is older than a day
            self.pruned = minute
            for minutes in self.counts.values():
                for old in [m for m in minutes if m <= minute - KEPT_MINUTES]:
                    del minutes[old]

    def totals(self, kind: str) -> dict[str, int]:
        """Per queue, never pruned: what a Prometheus counter needs."""
        return {queue: n for (queue, k), n in self.total.items() if k == kind}

    def _in(self, kind: str, minute: int, queue: str | None) -> int:
        return sum(c.get(minute, 0) for (q, k), c in self.counts.items() if k == kind and queue in (None, q))

    def per_minute(self, now: datetime, queue: str | None = None) -> dict[str, Any]:
        """The last 60 seconds: this minute so far, and the part of the last one still inside them."""
        return {"processed_per_minute": self.rate("processed", now, queue),
                "failed_per_minute": self.rate("failed", now, queue)}

    def rate(self, kind: str, now: datetime, queue: str | None = None) -> float:
        """How many of `kind` in the last 60 seconds (this minute so far, and the rest from the last)."""
        minute, inside = _minute(now), 1 - (now.timestamp() % 60) / 60
        return round(self._in(kind, minute, queue) + inside * self._in(kind, minute - 1, queue), 2)

    def history(self, period: str, since: datetime | None, until: datetime | None, now: datetime,
                queue: str | None = None) -> dict[str, Any]:
        if period not in PERIODS:
            raise invalid(f"period must be one of {', '.join(PERIODS)}")
        step = PERIODS[period]
        until = until or now
        since = since or until - timedelta(hours=1)
        if since >= until:
            raise invalid("since must be before until")
        first, last = _minute(since) // step * step, _minute(until)
        if (last - first) // step > 2000:
            raise invalid("that range holds more than 2000 periods: choose a longer period")
        totals: dict[tuple[str, int], int] = Counter()  # (kind, period start) -> jobs
        for (q, kind), minutes in self.counts.items():
            if queue is None or q == queue:
                for minute, n in minutes.items():
                    if first <= minute <= last:
                        totals[(kind, minute // step * step)] += n
        data = []
        for start in range(first, last + 1, step):
            point: dict[str, Any] = {"timestamp": iso(datetime.fromtimestamp(start * 60, timezone.utc))}
            point.update({kind: totals[(kind, start)] for kind in KINDS})
            data.append(point)
        return {"period": period, "data": data}
