"""What the engine knows without asking NATS: the last record of every key, and the orders over them.

KV is the truth; this is its in-process mirror, rebuilt at start, so that a
fetch pops the next job of a queue from a heap instead of scanning, stats are
counters, and clocks are one heap of deadlines. No I/O: every method is a
plain data-structure step, tested without a server.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from seamq.jobs.model import AVAILABLE, DISCARDED, STATES, decode, encode


@dataclass
class TokenBucket:
    """`options.rate_limit.max_per_second` of a queue: starts full, capacity max(1, rate)."""

    rate: float
    tokens: float = -1.0
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = max(1.0, self.rate)

    def take(self, wanted: int) -> int:
        now = time.monotonic()
        self.tokens = min(max(1.0, self.rate), self.tokens + (now - self.at) * self.rate)
        self.at = now
        granted = min(wanted, int(self.tokens))
        self.tokens -= granted
        return granted


HELD_APART = ("id", "queue", "state")  # a job's fields held beside its JSON, not in it


class Index:
    """Jobs are held as compact JSON (about a quarter of a dict's memory: 100k waiting jobs must fit
    a small server) less the fields held beside it, and decoded when asked for; the few records of
    other kinds stay dicts."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[bytes, int, str, str]] = {}  # id -> (json, revision, queue, state)
        self.others: dict[str, tuple[dict, int]] = {}  # workflows, crons, queue flags by key
        self.ready: dict[str, list[tuple[int, int, str]]] = {}  # queue -> heap of (-priority, seq, id)
        self.counts: Counter[tuple[str, str]] = Counter()  # (queue, state) -> jobs
        self.dead: set[str] = set()  # dead letters (on_exhaustion: dead_letter)
        self.deadlines: list[tuple[float, str, str, int]] = []  # (epoch s, kind, key, attempt)
        self.limits: dict[str, TokenBucket] = {}

    def get(self, key: str) -> tuple[dict, int] | None:
        held = self.jobs.get(key)
        if held is not None:
            return self._job(key, held), held[1]
        return self.others.get(key)

    @staticmethod
    def _job(key: str, held: tuple[bytes, int, str, str]) -> dict:
        return {"id": key, "queue": held[2], "state": held[3], **decode(held[0])}

    def revision(self, key: str) -> int | None:
        held = self.jobs.get(key) or self.others.get(key)
        return held[1] if held else None

    def put(self, record: dict, revision: int) -> None:
        """The record as stored at `revision`; an available job joins its queue's heap."""
        key = record.get("_key") or record["id"]
        known = self.revision(key)
        if known is not None and known >= revision:
            return  # known already, or an older write arriving late (a reload racing a commit)
        if record.get("_kind"):
            self.others[key] = (record, revision)
            return
        queue, state = sys.intern(record["queue"]), sys.intern(record["state"])
        old = self.jobs.get(key)
        if old is not None:
            self.counts[(old[2], old[3])] -= 1
        self.jobs[key] = (encode({k: v for k, v in record.items() if k not in HELD_APART}), revision, queue, state)
        self.counts[(queue, state)] += 1
        if record.get("_dlq") and state == DISCARDED:
            self.dead.add(key)
        else:
            self.dead.discard(key)
        if state == AVAILABLE:
            # FIFO key: the revision that made it available (monotonic in the stream). A heap entry
            # whose job has moved on since (another revision) is skipped when popped.
            heapq.heappush(self.ready.setdefault(queue, []), (-record["priority"], revision, key))
        limit = (record.get("options") or {}).get("rate_limit")
        if isinstance(limit, dict) and queue not in self.limits:
            self.limits[queue] = TokenBucket(float(limit["max_per_second"]))

    def drop(self, key: str) -> None:
        self.others.pop(key, None)
        old = self.jobs.pop(key, None)
        if old is not None:
            self.counts[(old[2], old[3])] -= 1
            self.dead.discard(key)

    def next_available(self, queue: str) -> tuple[dict, int] | None:
        """Pop the queue's next available job (priority, then FIFO), or None."""
        heap = self.ready.get(queue)
        while heap:
            _, seq, job_id = heapq.heappop(heap)
            held = self.jobs.get(job_id)
            if held is not None and held[1] == seq:
                return self._job(job_id, held), seq
        return None

    def take_available(self, queue: str, count: int) -> list[tuple[dict, int]]:
        """Pop up to `count` of the queue's next available jobs, in order."""
        out = []
        while len(out) < count and (held := self.next_available(queue)) is not None:
            out.append(held)
        return out

    def stats(self, queue: str) -> dict:
        return {state: self.counts[(queue, state)] for state in STATES}

    def of_kind(self, kind: str) -> list[tuple[dict, int]]:
        return [held for held in self.others.values() if held[0].get("_kind") == kind]

    def dead_letters(self) -> list[dict]:
        return [self._job(key, self.jobs[key]) for key in self.dead]

    # ---- deadlines ------------------------------------------------------------------------------

    def at(self, epoch: float, kind: str, key: str, attempt: int = 0) -> None:
        heapq.heappush(self.deadlines, (epoch, kind, key, attempt))

    def due(self, now: float) -> list[tuple[str, str, int]]:
        out = []
        while self.deadlines and self.deadlines[0][0] <= now:
            _, kind, key, attempt = heapq.heappop(self.deadlines)
            out.append((kind, key, attempt))
        return out

    def next_deadline(self) -> float | None:
        return self.deadlines[0][0] if self.deadlines else None
