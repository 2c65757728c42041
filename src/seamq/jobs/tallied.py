"""The job store with its counts: a commit that moves a job's state also writes its queue's tally,
in the same atomic batch (seamq.jobs.tally says why and what a tally holds).

An atomic batch costs nats-server about as much CPU for one record as for a hundred (on one node it
is staged in a file store of its own: docs/benchmarks.md 7g, 7i), so commits that move counts are
gathered: those waiting when a lane comes free go out together, as one batch with one tally per
queue, the way River's completer gathers completions. A commit whose writes may wait
(Write.may_wait: a worker's ack) is held until its time is up or another commit goes, so that a
worker's acks and its next fetch's claims share one batch instead of paying one each. One batch is
on its way at a time: what comes meanwhile goes next, as one. A batch whose CAS loses is tried again
without the commits whose records, read once, show them written again since (told at once that they
lost), or, when none does, without those the read shows behind (a replica that lags), which go one
at a time; so a conflict is told to the commit that lost it and to no other. A fetch that meets a
job's ready entry before its record (the entry is written first) waits for the record's commit here
(`landed`), in a batch or sent at once.

A queue has tally.SLOTS tally records, whatever the number of servers and however often they
restart, so reading a queue's counts costs the same in a year as today. Each process sends its
batches on LANES of them, starting at a random one: a slot is rarely shared, and a CAS lost to another
process's batch on it (seen as its record changed behind this one's back) is read again and tried
again. A batch whose outcome is unknown (NATS did not answer) forgets what it knew of its slots,
which are read again before their next use. A commit that replaces a record whose ack its process
has not counted yet (its mark, seamq.jobs.recounts) moves that count itself and takes the ack's number
in the same batch.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from seamq.jobs import model, tally
from seamq.jobs.ports import Conflict, JobStore, Write

# Batches in flight at once, per process. One: on one node every batch pays its staging whatever it
# holds, and commits that wait behind the batch on its way go next as one (docs/benchmarks.md 7t).
LANES = 1
SLOT_TRIES = 8  # a batch tried again while other processes' batches move its slot's tally


@dataclass
class _Commit:
    writes: list[Write]
    moved: list[tally.Move]
    due: float  # loop time by which it goes out
    takes: list[tuple[str, int]] = field(default_factory=list)  # acks' marks it counts instead of their process
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def size(self) -> int:
        return len(self.writes) + len({move[0] for move in self.moved}) + len({epoch for epoch, _ in self.takes})


class Tallied:
    """A JobStore (every method but `commit`, `wipe` and `close` is the store's own) whose commits
    keep counts."""

    def __init__(self, store: JobStore, *, clock: Callable[[], datetime] = model.utcnow, lanes: int = LANES) -> None:
        self.store, self.clock = store, clock
        first = random.randrange(tally.SLOTS)
        self._idle = [(first + lane) % tally.SLOTS for lane in range(lanes)]
        self._waiting: list[_Commit] = []
        self._first_due = math.inf  # the earliest `due` of the waiting commits
        self._running: set[asyncio.Task] = set()
        self._known: dict[str, tuple[dict | None, int]] = {}  # a slot's tally as this process last saw it
        self._on_way: dict[str, asyncio.Future] = {}  # key -> the last commit writing it, until answered
        self._timer: asyncio.TimerHandle | None = None  # wakes the first commit that may wait when its time is up
        self._timer_at = math.inf  # when (uvloop's handles cannot say)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def commit(self, writes: list[Write]) -> list[int]:
        takes: list[tuple[str, int]] = []
        if any(_marked(write) for write in writes):  # rare: the marks they bear read as last stored
            marks = await self._marks(writes)
            moved = _moved(writes, marks)
            takes = [(mark[0], mark[1]) for write in writes if (mark := _marked(write)) and not tally.covered(mark, marks)]
        else:
            moved = _moved(writes)
        if not moved and not takes:  # sent at once; on its way meanwhile too (a job made available, counted later)
            sending = asyncio.get_running_loop().create_future()
            for write in writes:
                self._on_way[write.key] = sending
            try:
                return await self.store.commit(writes)
            finally:
                sending.set_result(None)
                self._answered(writes, sending)
        pending = self._queued(writes, moved, takes)
        self._lend()
        try:
            return await asyncio.shield(pending.done)
        except asyncio.CancelledError:
            self._unsent([pending])
            raise  # else it is in a batch on its way, stored or not as NATS decides

    async def commit_each(self, commits: list[list[Write]]) -> list[list[int] | BaseException]:
        """Several commits, each all or nothing on its own, with no task or wait of their own: those that
        move counts gathered as `commit` gathers them, the others sent together by the store."""
        if any(_marked(write) for writes in commits for write in writes):  # rare: read their marks first
            return list(await asyncio.gather(*(self.commit(writes) for writes in commits), return_exceptions=True))
        queued: dict[int, asyncio.Future] = {}
        plain: dict[int, list[Write]] = {}
        for n, writes in enumerate(commits):
            moved = _moved(writes)
            if moved:
                queued[n] = self._queued(writes, moved).done
            else:
                plain[n] = writes
        self._lend()
        try:
            sent = await self.store.commit_each(list(plain.values())) if plain else []
            outcomes = dict(zip(plain, sent))
            outcomes.update(zip(queued, await asyncio.gather(*queued.values(), return_exceptions=True)))
        except asyncio.CancelledError:
            mine = set(queued.values())
            self._unsent([p for p in self._waiting if p.done in mine])
            raise
        return [outcomes[n] for n in range(len(commits))]

    async def landed(self, key: str) -> None:
        if (pending := self._on_way.get(key)) is not None:
            await asyncio.wait([pending])  # its outcome is its caller's

    def _queued(self, writes: list[Write], moved: list[tally.Move], takes: list[tuple[str, int]] | None = None) -> _Commit:
        pending = _Commit(writes, moved, asyncio.get_running_loop().time() + min(write.may_wait for write in writes),
                          takes or [])
        pending.done.add_done_callback(_heard)
        for write in writes:
            self._on_way[write.key] = pending.done
        pending.done.add_done_callback(lambda done: self._answered(writes, done))
        self._waiting.append(pending)
        self._first_due = min(self._first_due, pending.due)
        return pending

    def _answered(self, writes: list[Write], done: asyncio.Future) -> None:
        for write in writes:
            if self._on_way.get(write.key) is done:  # else a later commit of it is on its way
                del self._on_way[write.key]

    def _unsent(self, cancelled: list[_Commit]) -> None:
        """Commits whose callers went away: those not yet sent never will be."""
        for pending in cancelled:
            if pending in self._waiting:
                self._waiting.remove(pending)
                pending.done.cancel()
        self._first_due = min((p.due for p in self._waiting), default=math.inf)

    async def wipe(self) -> None:
        self._known.clear()
        await self.store.wipe()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        await self.store.close()

    def _lend(self) -> None:
        while self._due() and self._idle:
            task = asyncio.create_task(self._send(self._idle.pop()))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _due(self) -> bool:
        """Whether a waiting commit must go now (and with it all the others); else the timer is set
        for the first one that may wait."""
        if not self._waiting:
            return False
        loop, first = asyncio.get_running_loop(), self._first_due
        if first <= loop.time():
            return True
        if self._timer is None or self._timer_at > first:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = loop.call_at(first, self._woken), first
        return False

    def _woken(self) -> None:
        self._timer = None
        self._lend()

    async def _send(self, lane: int) -> None:  # a lane is its slot
        try:
            while self._due() and (group := self._gather()):
                await self._batch(group, lane)
        finally:
            self._idle.append(lane)
            self._lend()

    def _gather(self) -> list[_Commit]:
        """The waiting commits that fit one batch, in the order they came; one that writes a key
        already in the batch waits for the next (its CAS would lose to the first). Takes of one
        process's acks go together (one write of its marks record), apart from its own marks' write."""
        group: list[_Commit] = []
        rest: list[_Commit] = []
        keys: set[str] = set()
        taking: set[str] = set()
        size = 0
        for pending in self._waiting:
            mine, takes = {write.key for write in pending.writes}, {tally.marks_key(e) for e, _ in pending.takes}
            if group and (keys & (mine | takes) or taking & mine or size + pending.size() > model.MAX_BATCH):
                rest.append(pending)
                continue
            group.append(pending)
            keys |= mine
            taking |= takes
            size += pending.size()
        self._waiting = rest
        self._first_due = min((pending.due for pending in rest), default=math.inf)
        return group

    async def _batch(self, group: list[_Commit], lane: int, *, split: bool = True) -> None:
        try:
            revisions = await self._commit([w for c in group for w in c.writes], [m for c in group for m in c.moved], lane,
                                           [t for c in group for t in c.takes])
        except Conflict as exc:
            if len(group) == 1:
                return _settle(group[0], exc)
            # A commit whose record was written again since it was read surely lost: told so now, not
            # sent alone to lose (hundreds of such batches of one, each staged by nats-server, once held
            # every count-moving commit behind them for seconds: docs/benchmarks.md 7z). The rest go
            # again. When the records show none written again, which one lost only each alone can tell;
            # the records read once set apart those they show behind (a replica that lags), and the
            # others go together once more (each alone if that loses too).
            lost, behind = await self._behind(group) if split else ({}, set())
            if lost:
                for n, key in lost.items():
                    _settle(group[n], Conflict(f"{key}: written again since it was read"))
                if rest := [pending for n, pending in enumerate(group) if n not in lost]:
                    await self._batch(rest, lane)
                return
            together = [pending for n, pending in enumerate(group) if n not in behind]
            if not behind or not together:  # nothing to go by: each alone
                behind, together = set(range(len(group))), []
            if together:
                await self._batch(together, lane, split=False)
            for n in sorted(behind):
                await self._batch([group[n]], lane)
            return
        except asyncio.CancelledError:
            for pending in group:
                pending.done.cancel()
            raise
        except Exception as exc:  # stored or not, nobody knows: each caller is told
            for pending in group:
                _settle(pending, exc)
            return
        start = 0
        for pending in group:
            _settle(pending, revisions[start:start + len(pending.writes)])
            start += len(pending.writes)

    async def _commit(self, writes: list[Write], moved: list[tally.Move], lane: int,
                      takes: list[tuple[str, int]] | None = None) -> list[int]:
        by_queue: dict[str, list[tally.Move]] = {}
        for move in moved:
            by_queue.setdefault(move[0], []).append(move)
        for attempt in range(SLOT_TRIES):
            tallies = []
            for queue, queue_moves in by_queue.items():
                key = tally.key(queue, lane)
                record, revision = self._known.get(key) or await self._read(key)
                tallies.append(Write(key, tally.applied(record, queue, queue_moves, self.clock()), revision))
            taken = await self._taken(takes) if takes else []
            try:
                revisions = await self.store.commit([*writes, *tallies, *taken])
            except Conflict:
                if attempt == SLOT_TRIES - 1 or not await self._stale([*tallies, *taken]):
                    raise  # a job's own CAS lost (or the slot stayed too busy)
                continue
            except BaseException:
                for write in tallies:  # stored or not: read again before the next use
                    self._known.pop(write.key, None)
                raise
            for write, revision in zip(tallies, revisions[len(writes):]):
                self._known[write.key] = (write.record, revision)
            return revisions[:len(writes)]
        raise AssertionError("unreachable")

    async def _behind(self, group: list[_Commit]) -> tuple[dict[int, str], set[int]]:
        """The commits of `group` a record of which the store shows written again since it was read (at
        a revision past the one the write expects, which no lag can show: it surely lost), with that
        record's key; and those a record of which it shows behind (a replica may lag: the
        compare-and-set decides)."""
        try:
            held = await self.store.get_many(list({w.key for c in group for w in c.writes if w.revision is not None}))
        except Exception:  # only a hint: without it, each alone
            return {}, set()
        lost: dict[int, str] = {}
        behind: set[int] = set()
        for n, pending in enumerate(group):
            for w in (w for w in pending.writes if w.revision is not None):
                now = held[w.key].revision if w.key in held else 0
                if now > w.revision:
                    lost.setdefault(n, w.key)
                elif now != w.revision:
                    behind.add(n)
        return lost, behind - lost.keys()

    async def _marks(self, writes: list[Write]) -> tally.Marks:
        """The marks records, as last stored, of the epochs whose marks the records replaced bear."""
        marks = {}
        for epoch in {mark[0] for write in writes if (mark := _marked(write))}:
            if (held := await self.store.get(tally.marks_key(epoch))) is not None:
                marks[epoch] = held.record
        return marks

    async def _taken(self, takes: list[tuple[str, int]]) -> list[Write]:
        """Acks whose process has not counted them yet, counted by this batch instead: their numbers put
        in their process's `skip`, one write per process whatever the number of acks (a compare-and-set
        on its marks record, as last stored: its own batch and this one do not both count them). One
        that its process counted since its commit read the marks loses (Conflict): read again, its
        count is where its record is."""
        out = []
        for epoch in {epoch for epoch, _ in takes}:
            record, revision = await self._read(tally.marks_key(epoch))
            numbers = [n for e, n in takes if e == epoch]
            if record is not None and any(tally.covered([epoch, n], {epoch: record}) for n in numbers):
                raise Conflict(f"an ack of {epoch} was counted by its process meanwhile")
            out.append(Write(tally.marks_key(epoch), tally.marks_record(
                epoch, record["upto"] if record else 0, [*(record["skip"] if record else []), *numbers]), revision, True))
        return out

    async def _read(self, key: str) -> tuple[dict | None, int]:
        held = await self.store.get(key)
        return held if held is not None else (None, 0)

    async def _stale(self, tallies: list[Write]) -> bool:
        """Whether a slot's record changed since it was read for this batch (another process's batch,
        or one of this process's whose answer never came); what it holds now is kept."""
        stale = False
        for write in tallies:
            fresh = await self._read(write.key)
            self._known[write.key] = fresh
            stale = stale or fresh[1] != write.revision
        return stale


def _settle(pending: _Commit, outcome: list[int] | BaseException) -> None:
    if pending.done.done():
        return
    if isinstance(outcome, BaseException):
        pending.done.set_exception(outcome)
    else:
        pending.done.set_result(outcome)


def _heard(done: asyncio.Future) -> None:
    """A caller cancelled while its batch was on the way is not there to hear how it went."""
    if not done.cancelled():
        done.exception()


def _moved(writes: list[Write], marks: tally.Marks | None = None) -> list[tally.Move]:
    """The counts the writes move; a record whose ack's mark `marks` does not cover counts where it was."""
    return [*(move for write in writes if _is_job(write) for move in tally.moves(_before(write), write.record, marks)),
            *(move for write in writes for move in write.moves)]


def _marked(write: Write) -> list | None:
    return write.before.get("_mark") if write.before else None


def _is_job(write: Write) -> bool:
    return "." not in write.key  # the jobs' keys have no dot; queues', crons', tallies' have


def _before(write: Write) -> dict | None:
    if write.before is None and write.revision != 0:
        raise ValueError(f"the change of job {write.key} does not say what it replaces: its counts would drift")
    return write.before
