"""The job store in memory: the engine's rules tested in a unit tier without NATS, on a clock the test
moves (`advance`), so a lease or a retry due in an hour takes no time. It keeps the port's promises
(tests/contracts/jobs/test_jobs_store_contract.py), not NATS' performance.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import Counter, deque
from datetime import datetime, timedelta, timezone

from seamq.jobs.ports import TAKEN_HOLD, Conflict, Fired, Stored, Taken, Write


ACK_WAIT = timedelta(seconds=30)  # a fired timer or a relayed job not done by then is handed out again (a server died)
IDLE = 0.01  # seconds (real time) a take with nothing to hand waits (_hand_out)
LOG_KEPT = 10_000  # batches of events, as the NATS store keeps


class Clock:
    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class MemoryJobStore:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.records: dict[str, Stored] = {}
        self.replica: dict[str, Stored] | None = None  # what get_many sees while it lags
        self.revision = 0
        self.seq = itertools.count(1)
        # queue -> priority -> entries in the order offered: (seq, job id, revision, deliveries, tenant)
        self.ready: dict[str, dict[int, deque[tuple[int, str, int, int, str]]]] = {}
        self.turns = itertools.count()  # which lane a take serves first
        self.held: dict[str, tuple[datetime, str, int, tuple[int, str, int, int]]] = {}  # hold -> (until, queue, prio, entry)
        self.timers: dict[tuple[str, str], tuple[datetime, dict]] = {}
        self.handed: dict[tuple[str, str], tuple[datetime, dict]] = {}  # fired, not yet done: (when, token)
        self.deliveries: Counter[tuple[str, str]] = Counter()
        self.batches: deque[tuple[int, bytes]] = deque(maxlen=LOG_KEPT)  # the event log
        self.locks: dict[str, tuple[str, datetime | None]] = {}  # fingerprint -> (job id, until)
        self.followers: list[tuple[tuple[str, ...], asyncio.Queue]] = []
        self.relayed: dict[object, tuple[datetime, bytes]] = {}  # relayed jobs waiting: handle -> (due, body)
        self.taken: dict[object, tuple[datetime, bytes]] = {}  # taken in, not yet done: handle -> (when, body)

    async def close(self) -> None:
        """Nothing to let go of."""

    # ---- records ------------------------------------------------------------------------------------

    async def get(self, key: str) -> Stored | None:
        held = self.records.get(key)
        return Stored(copy.deepcopy(held.record), held.revision) if held else None

    async def get_many(self, keys: list[str]) -> dict[str, Stored]:
        seen = self.records if self.replica is None else self.replica
        return {key: Stored(copy.deepcopy(seen[key].record), seen[key].revision) for key in keys if key in seen}

    def lag(self) -> None:
        """From now until `catch_up`, `get_many` answers as a replica that applied nothing after now
        (as NATS' direct gets may): for tests of what the engine decides on such reads."""
        self.replica = copy.deepcopy(self.records)

    def catch_up(self) -> None:
        self.replica = None

    async def landed(self, key: str) -> None:
        """Each commit is answered to its caller: none is on its way."""

    async def commit_each(self, commits: list[list[Write]]) -> list[list[int] | BaseException]:
        out: list[list[int] | BaseException] = []
        for writes in commits:
            try:
                out.append(await self.commit(writes))
            except Exception as exc:
                out.append(exc)
        return out

    async def commit(self, writes: list[Write]) -> list[int]:
        for write in writes:  # every check first: all or none
            current = self.records.get(write.key)
            if write.revision is not None and (current.revision if current else 0) != write.revision:
                raise Conflict(write.key)
        out = []
        for write in writes:
            self.revision += 1
            if write.record is None:
                self.records.pop(write.key, None)
            else:
                self.records[write.key] = Stored(copy.deepcopy(write.record), self.revision)
            self._tell(write.key, write.record)
            out.append(self.revision)
        return out

    async def delete(self, key: str) -> None:
        if self.records.pop(key, None) is not None:
            self._tell(key, None)

    async def scan(self, prefix: str) -> list[Stored]:
        return [Stored(copy.deepcopy(record), revision) for key, (record, revision) in list(self.records.items())
                if (key.startswith(prefix) if prefix else "." not in key)]

    async def follow(self, prefixes: list[str]):
        changes: asyncio.Queue = asyncio.Queue()
        self.followers.append((tuple(prefixes), changes))
        for key, (record, _) in list(self.records.items()):
            if key.startswith(tuple(prefixes)):
                yield key, copy.deepcopy(record)
        yield "", None
        while True:
            yield await changes.get()

    def _tell(self, key: str, record: dict | None) -> None:
        for prefixes, changes in self.followers:
            if key.startswith(prefixes):
                changes.put_nowait((key, copy.deepcopy(record)))

    # ---- the ready order ----------------------------------------------------------------------------

    async def offer(self, queue: str, priority: int, job_id: str, tenant: str = "") -> None:
        seq = next(self.seq)
        self._queue(queue, priority).append((seq, job_id, seq, 0, tenant))

    async def withdraw(self, queue: str, priority: int, job_id: str, tenant: str = "") -> None:
        waiting = self._queue(queue, priority)
        self.ready[queue][priority] = deque(e for e in waiting if e[1] != job_id)
        for hold, (_, held_queue, _, entry) in list(self.held.items()):
            if held_queue == queue and entry[1] == job_id:
                del self.held[hold]

    def _queue(self, queue: str, priority: int) -> deque:
        return self.ready.setdefault(queue, {}).setdefault(priority, deque())

    def _expire_holds(self) -> None:
        """Holds that ran out: their entries come back, before later ones (as JetStream redelivers)."""
        now = self.clock()
        for hold, (until, queue, priority, entry) in list(self.held.items()):
            if until <= now:
                del self.held[hold]
                waiting = self._queue(queue, priority)
                waiting.append(entry)
                self.ready[queue][priority] = deque(sorted(waiting))

    async def take(self, queue: str, count: int, tenant: str | None = None) -> list[Taken]:
        self._expire_holds()
        out: list[Taken] = []
        for priority in sorted(self.ready.get(queue, {}), reverse=True):
            waiting = self.ready[queue][priority]
            lanes = sorted({e[4] for e in waiting} if tenant is None else {tenant} & {e[4] for e in waiting})
            turn = next(self.turns) % len(lanes) if lanes else 0
            lanes = lanes[turn:] + lanes[:turn]
            while lanes and len(out) < count:  # one entry from each lane in turn
                for lane in list(lanes):
                    entry = next((e for e in waiting if e[4] == lane), None)
                    if entry is None or len(out) >= count:
                        lanes.remove(lane)
                        continue
                    waiting.remove(entry)
                    out.append(self._taken(queue, priority, entry))
        return out

    def _taken(self, queue: str, priority: int, entry: tuple[int, str, int, int, str]) -> Taken:
        seq, job_id, revision, deliveries, tenant = entry
        hold = f"hold.{queue}.{seq}.{deliveries + 1}"
        self.held[hold] = (self.clock() + timedelta(seconds=TAKEN_HOLD), queue, priority,
                           (seq, job_id, revision, deliveries + 1, tenant))
        return Taken(job_id, f"{queue}.{seq}", hold, deliveries + 1)

    async def hold(self, hold: str, seconds: float) -> None:
        found = self.held.get(hold)
        if found is not None:
            self.held[hold] = (self.clock() + timedelta(seconds=seconds), *found[1:])

    async def settle(self, hold: str) -> None:
        self.held.pop(hold, None)

    async def waiting(self, queue: str) -> dict[int, int]:
        counts = {p: len(entries) for p, entries in self.ready.get(queue, {}).items() if entries}
        for _, held_queue, priority, _ in self.held.values():
            if held_queue == queue:
                counts[priority] = counts.get(priority, 0) + 1
        return counts

    async def queues(self) -> list[str]:
        return sorted(self.ready)

    async def ready_counts(self, queue: str) -> tuple[int, int]:
        self._expire_holds()
        waiting = sum(len(entries) for entries in self.ready.get(queue, {}).values())
        return waiting, sum(1 for held in self.held.values() if held[1] == queue)

    # ---- timers -------------------------------------------------------------------------------------

    async def arm(self, kind: str, key: str, at: datetime, token: dict) -> None:
        self.deliveries.pop((kind, key), None)
        self.timers[(kind, key)] = (at, dict(token))

    async def disarm(self, kind: str, key: str) -> None:
        self.timers.pop((kind, key), None)

    async def fired(self, batch: int = 100, timeout: float = 0.0) -> list[Fired]:
        out = []
        for kind, key in await _hand_out(self.timers, self.handed, self.clock(), batch, timeout):
            self.deliveries[(kind, key)] += 1
            out.append(Fired(kind, key, self.handed[(kind, key)][1], (kind, key), self.deliveries[(kind, key)]))
        return out

    async def done(self, fired: Fired) -> None:
        self.handed.pop(fired.handle, None)
        self.deliveries.pop(fired.handle, None)

    async def again(self, fired: Fired, seconds: float) -> None:
        if self.handed.pop(fired.handle, None) is not None:
            self.timers.setdefault(fired.handle, (self.clock() + timedelta(seconds=seconds), fired.token))

    # ---- intake: what a relay publishes to `OJS_ENQUEUE`, held as the NATS store holds it ---------

    def relay(self, data: bytes) -> None:
        """A relayed job's body, as the relay sends it (this store has no relay: a test's way in)."""
        self.relayed[next(self.seq)] = (self.clock(), data)

    async def taken_in(self, batch: int = 100, timeout: float = 1.0) -> list[tuple[bytes, object]]:
        return [(self.taken[handle][1], handle)
                for handle in await _hand_out(self.relayed, self.taken, self.clock(), batch, timeout)]

    async def later(self, handle: object, delay: float) -> None:
        if (held := self.taken.pop(handle, None)) is not None:
            self.relayed[handle] = (self.clock() + timedelta(seconds=delay), held[1])

    async def intake_done(self, handle: object) -> None:
        self.taken.pop(handle, None)

    # ---- the event log ----------------------------------------------------------------------

    async def log(self, batch: bytes) -> int:
        seq = self.batches[-1][0] + 1 if self.batches else 1
        self.batches.append((seq, batch))
        return seq

    async def logged(self, after: int, most: int) -> list[tuple[int, bytes]]:
        return [b for b in self.batches if b[0] > after][:most]

    async def log_bounds(self) -> tuple[int, int]:
        return (self.batches[0][0], self.batches[-1][0]) if self.batches else (0, 0)

    # ---- unique locks --------------------------------------------------------------------------------

    async def lock_unique(self, fingerprint: str, job_id: str, period: float | None) -> str | None:
        held = self.locks.get(fingerprint)
        if held is not None and (held[1] is None or held[1] > self.clock()):
            return held[0]
        await self.take_unique(fingerprint, job_id, period)
        return None

    async def take_unique(self, fingerprint: str, job_id: str, period: float | None) -> None:
        self.locks[fingerprint] = (job_id, self.clock() + timedelta(seconds=period) if period else None)

    def reachable(self) -> bool:
        return True

    async def wipe(self) -> None:
        followers = self.followers
        self.__init__(self.clock)
        self.followers = followers


async def _hand_out(waiting: dict, handed: dict, now: datetime, batch: int, timeout: float) -> list:
    """The keys of `waiting` (key -> (due, value)) due by `now`, earliest first, now `handed` (key ->
    (when, value)) until done; one handed ACK_WAIT ago and never done waits again (a server died). With
    none to hand, a take waits IDLE of real time: an engine's loops poll, not spin."""
    for key, (handed_at, value) in list(handed.items()):
        if handed_at + ACK_WAIT <= now:
            waiting.setdefault(key, (handed_at, value))  # unless armed again meanwhile
            del handed[key]
    due = sorted((at, key) for key, (at, _) in waiting.items() if at <= now)[:batch]
    for _, key in due:
        handed[key] = (now, waiting.pop(key)[1])
    if not due and timeout:
        await asyncio.sleep(min(timeout, IDLE))
    return [key for _, key in due]
