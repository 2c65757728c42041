"""What the engine knows without asking NATS: the last record of every key, and the orders over them.

KV is the truth; this is its in-process mirror, rebuilt at start, so that a
fetch pops the next job of a queue from a heap instead of scanning, stats are
counters, and clocks are one heap of deadlines. No I/O: every method is a
plain data-structure step, tested without a server.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field

from seamq.jobs.model import AVAILABLE, STATES


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


class Index:
    def __init__(self) -> None:
        self.records: dict[str, tuple[dict, int]] = {}  # key -> (record, revision); jobs by id
        self.ready: dict[str, list[tuple[int, int, str]]] = {}  # queue -> heap of (-priority, seq, id)
        self.counts: Counter[tuple[str, str]] = Counter()  # (queue, state) -> jobs
        self.deadlines: list[tuple[float, str, str, int]] = []  # (epoch s, kind, key, attempt)
        self.limits: dict[str, TokenBucket] = {}

    def get(self, key: str) -> tuple[dict, int] | None:
        return self.records.get(key)

    def put(self, record: dict, revision: int) -> None:
        """The record as stored at `revision`; an available job joins its queue's heap."""
        key = record.get("_key") or record["id"]
        old = self.records.get(key)
        if old is not None and old[1] >= revision:
            return  # known already, or an older write arriving late (a reload racing a commit)
        self.records[key] = (record, revision)
        if record.get("_kind"):
            return
        if old is not None:
            self.counts[(old[0]["queue"], old[0]["state"])] -= 1
        self.counts[(record["queue"], record["state"])] += 1
        if record["state"] == AVAILABLE:
            # FIFO key: the revision that made it available (monotonic in the stream). A heap entry
            # whose job has moved on since (another revision) is skipped when popped.
            heapq.heappush(self.ready.setdefault(record["queue"], []), (-record["priority"], revision, key))
        limit = (record.get("options") or {}).get("rate_limit")
        if isinstance(limit, dict) and record["queue"] not in self.limits:
            self.limits[record["queue"]] = TokenBucket(float(limit["max_per_second"]))

    def drop(self, key: str) -> None:
        old = self.records.pop(key, None)
        if old is not None and not old[0].get("_kind"):
            self.counts[(old[0]["queue"], old[0]["state"])] -= 1

    def next_available(self, queue: str) -> tuple[dict, int] | None:
        """Pop the queue's next available job (priority, then FIFO), or None."""
        heap = self.ready.get(queue)
        while heap:
            _, seq, job_id = heapq.heappop(heap)
            held = self.records.get(job_id)
            if held is not None and held[1] == seq:
                return held
        return None

    def stats(self, queue: str) -> dict:
        return {state: self.counts[(queue, state)] for state in STATES}

    def of_kind(self, kind: str) -> list[tuple[dict, int]]:
        return [held for held in self.records.values() if held[0].get("_kind") == kind]

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
