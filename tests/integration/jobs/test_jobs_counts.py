"""Every count a job server shows equals a scan of the jobs (seamq.jobs.tally), after random sequences
of pushes, fetches, acks, failures, cancels, retries of dead letters, deletes, lease expiries, timers
and servers killed mid-request, on engines that count at once, native workers' engines (whose claims
count later) and job servers' (whose claims and acks count later, seamq.jobs.recounts):
2,000 sequences on the in-memory store, 2,000 on NATS."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from datetime import timedelta

import pytest

from seamq.ids import uuid7
from seamq.jobs import model, tally
from seamq.jobs.engine import Engine
from seamq.jobs.memory_store import Clock, MemoryJobStore
from seamq.jobs.model import OjsError
from seamq.jobs.nats_store import NatsJobStore
from seamq.jobs.ports import TAKEN_HOLD, Conflict, Write
from seamq.jobs.tallied import Tallied

from helpers.engines import every_task_ran

SEQUENCES, STEPS = 2_000, 8
RETRY = {"max_attempts": 2, "initial_interval": "PT0.2S", "jitter": False, "on_exhaustion": "dead_letter"}


class Run:
    """One sequence's world: two servers on one store, the queue it owns, the jobs it made."""

    def __init__(self, rng: random.Random, queue: str, servers: list[Engine], make, at, wait) -> None:
        self.rng, self.queue, self.servers, self.make, self.at, self.wait = rng, queue, servers, make, at, wait
        self.ids: list[str] = []
        self.held: list[str] = []

    def server(self) -> Engine:
        return self.rng.choice(self.servers)

    def body(self) -> dict:
        options = {"queue": self.queue, "priority": self.rng.choice([0, 5])}
        if self.rng.random() < 0.3:
            options["retry"] = RETRY
        if self.rng.random() < 0.15:
            options["scheduled_at"] = self.at(self.rng.choice([0.2, 0.5]))
        return {"type": "t.count", "args": [], "options": options}

    async def step(self) -> None:
        name = self.rng.choice(["push", "push", "batch", "fetch", "fetch", "ack", "fail", "fail", "cancel", "retry",
                                "delete", "wait"] * 2 + ["kill"])
        job = self.rng.choice(self.ids) if self.ids else None
        held = self.rng.choice(self.held) if self.held else None
        try:
            if name == "push":
                self.ids.append((await self.server().ops.push(self.body()))[1]["id"])
            elif name == "batch":
                made = await self.server().ops.push_batch({"jobs": [self.body() for _ in range(self.rng.randint(2, 4))]})
                self.ids += [j["id"] for j in made]
            elif name == "fetch":
                lease = self.rng.choice([300, 60_000])
                got = await self.server().ops.fetch([self.queue], self.rng.randint(1, 3), "w", lease)
                self.held += [j["id"] for j in got]
            elif name == "ack" and held:
                await self.server().ops.ack(held)
            elif name == "fail" and held:
                await self.server().ops.nack(held, {"type": "Boom", "message": "failed"}, self.rng.random() < 0.2)
            elif name == "cancel" and job:
                await self.server().ops.cancel(job)
            elif name == "retry" and job:
                await (self.server().retry_dead_letter if self.rng.random() < 0.5 else self.server().retry)(job)
            elif name == "delete" and job:
                await self.server().delete(job)
                self.ids.remove(job)
            elif name == "wait":
                await self.wait(self.rng.choice([0.1, 0.4, 0.4, TAKEN_HOLD + 1]))  # NATS: 0.4 s at most
                for server in self.servers:
                    await server.tick()
            elif name == "kill":
                await self.kill()
        except OjsError as refused:  # a move the job's state does not allow: refused, nothing changed
            assert refused.status in (404, 409), refused

    async def kill(self) -> None:
        """A server dies in the middle of requests (a push and an ack, cancelled at a random await) and
        another starts; half the time what it left to count later is never counted by it (kill -9), and
        is counted by whoever meets the job next."""
        victim = self.rng.randrange(len(self.servers))
        bodies = [{**self.body(), "id": str(uuid7())} for _ in range(3)]
        self.ids += [body["id"] for body in bodies]  # stored or not: the store says which
        ops = self.servers[victim].ops
        requests = [asyncio.ensure_future(ops.push_batch({"jobs": bodies})),
                    *([asyncio.ensure_future(ops.ack(self.rng.choice(self.held)))] if self.held else [])]
        for _ in range(self.rng.randint(0, 6)):
            await asyncio.sleep(0)
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
        if self.rng.random() < 0.5:
            crash(self.servers[victim])
        await self.servers[victim].stop()
        self.servers[victim] = await self.make()

    async def check(self) -> None:
        async def made() -> list[dict]:
            return [record for record, _ in (await self.server().store.get_many(sorted(set(self.ids)))).values()]
        await agree(self.server(), {self.queue}, made)


def crash(server: Engine) -> None:
    """kill -9 as its counts see it: what it left to count later is never counted by it."""
    recounts = server.recounts
    recounts.stop()
    for task in recounts._tasks:
        task.cancel()
    recounts._marked.clear()
    recounts._later.clear()
    recounts._resolved = lambda *said: None


def counted(records: list[dict], marks: tally.Marks) -> Counter:
    """Where each record counts: its state, or where a claim, an ack or a timer's move that counts later
    left it (only a running, a completed or an available job's, seamq.jobs.recounts), an ack's until
    its process's marks record says it is counted."""
    assert all(r["state"] in ("available", "active", "completed") for r in records if "_counted" in r)
    return Counter(tally.place(r, marks)[:2] for r in records)


async def agree(server: Engine, queues: set[str], read) -> None:
    """Counts equal the records. Another lane's timers may move a job meanwhile (a scheduled job due),
    or a process count its acks: the records and the marks records are read before and after the counts,
    and a comparison across such a move is made again."""
    async def placed() -> Counter:
        records = await read()
        return counted(records, tally.marks_of([r for r, _ in await server.store.scan(tally.MARKS)]))
    for _ in range(20):
        before = await placed()
        shown = {queue: await server.queues.stats(queue) for queue in queues}
        if await placed() == before:
            break
    assert {q: {s: shown[q][s] for s in model.STATES} for q in queues} == {
        q: {s: before[q, s] for s in model.STATES} for q in queues}


async def sequences(count: int, lanes: int, world, at, wait, seed: int) -> None:
    """`count` sequences on `lanes` at once; each lane has its two servers on the store `world()` makes
    it, and ends with one scan of every job it made against every queue's counts."""
    async def lane(n: int) -> None:
        make = world()
        servers = [await make(), await make()]
        try:
            for k in range(n, count, lanes):
                rng = random.Random(seed * 100_000 + k)
                run = Run(rng, f"q{seed}-{k}", servers, make, at, wait)
                for _ in range(rng.randint(1, STEPS)):
                    await run.step()
                await run.check()
            await everything_agrees(servers[0], {f"q{seed}-{k}" for k in range(n, count, lanes)})
        finally:
            for server in servers:
                await server.stop()

    await asyncio.gather(*(lane(n) for n in range(lanes)))


async def everything_agrees(server: Engine, queues: set[str]) -> None:
    async def scan():
        return [j for j in await server.jobs() if j["queue"] in queues]
    await agree(server, queues, scan)


def later(n: int) -> dict[str, bool]:
    """In turn an engine that counts at once, a native worker's, a job server's."""
    return {"count_claims_later": n % 3 > 0, "count_acks_later": n % 3 == 2}


async def test_counts_equal_a_scan_after_random_sequences_on_the_memory_store():
    clock = Clock()

    def world():  # a store per lane: the memory store's scans read every record
        store, made = MemoryJobStore(clock), itertools.count()

        async def make() -> Engine:
            return await Engine(store, clock=clock, **later(next(made))).start(clocks=False)
        return make

    async def wait(seconds: float) -> None:
        clock.advance(seconds)

    await sequences(SEQUENCES, 100, world, lambda seconds: model.iso(clock() + timedelta(seconds=seconds)), wait,
                    seed=1)


@pytest.mark.timeout(900)  # its own limit: up to 20,000 steps on NATS, on a busy machine
async def test_counts_equal_a_scan_after_random_sequences_on_nats(nc):
    made = itertools.count()

    async def make() -> Engine:
        return await Engine(await NatsJobStore(nc).start(), **later(next(made))).start(clocks=False)

    def at(seconds: float) -> str:
        return model.iso(model.utcnow() + timedelta(seconds=seconds))

    async def wait(seconds: float) -> None:
        await asyncio.sleep(min(seconds, 0.4))

    await sequences(SEQUENCES, 16, lambda: make, at, wait, seed=2)


class Counted:
    """A store that counts the commits it is given: the batches Tallied sends."""

    def __init__(self, store) -> None:
        self.store, self.batches = store, 0

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    async def commit(self, writes):
        self.batches += 1
        return await self.store.commit(writes)

    async def commit_each(self, commits):  # each commit its own batch, sent together
        self.batches += len(commits)
        return await self.store.commit_each(commits)


def jobs_of(prefix: str, queue: str):
    """A job `prefix`n of `queue` in a state, as a record."""
    return lambda n, state: {"id": f"{prefix}{n}", "queue": queue, "state": state}


async def ten_made(raw_store, job, counted=Counted) -> tuple[Counted, Tallied, list]:
    """A store that counts the batches it is given, its Tallied, and ten jobs made available through it."""
    store = counted(raw_store)
    tallied = Tallied(store)
    return store, tallied, await tallied.commit_each([[Write(job(n, "available")["id"], job(n, "available"))] for n in range(10)])


@pytest.fixture(params=["memory", "nats"])
async def raw_store(request):
    if request.param == "memory":
        yield MemoryJobStore()
        return
    import nats

    nc = await nats.connect(request.getfixturevalue("nats_server").url)
    found = await NatsJobStore(nc).start()
    yield found
    await found.close()
    await nc.close()


async def test_commits_sent_together_each_hear_their_own_outcome(raw_store):
    """Commits waiting together go out as one batch; a CAS that loses in it fails that commit only,
    and the counts move for the commits stored and no other."""
    store = Counted(raw_store)
    tallied = Tallied(store)

    def job(n: int, state: str) -> dict:
        return {"id": f"g{n}", "queue": "gathered", "state": state}

    async def outcome(writes: list[Write]):
        try:
            return await tallied.commit(writes)
        except Conflict:
            return None

    created = await asyncio.gather(*(outcome([Write(f"g{n % 120}", job(n % 120, "available"))]) for n in range(140)))
    assert store.batches < 140  # gathered
    assert sum(r is None for r in created) == 20  # g0..g19 twice: the second create of each lost
    revisions = {f"g{n % 120}": r[0] for n, r in enumerate(created) if r is not None}
    assert len(revisions) == 120

    before = store.batches
    moves = [Write(key, job(int(key[1:]), "active"), revision - (n % 6 == 0), before=job(int(key[1:]), "available"))
             for n, (key, revision) in enumerate(sorted(revisions.items()))]  # every sixth on a stale revision
    moved = await asyncio.gather(*(outcome([write]) for write in moves))
    assert [r is None for r in moved] == [n % 6 == 0 for n in range(120)]
    assert store.batches - before < 120 + 20  # one batch, then the stale ones' alone and the rest's

    records = [record for record, _ in (await raw_store.get_many(sorted(revisions))).values()]
    counts = tally.summed([r for r, _ in await raw_store.scan(tally.prefix("gathered"))], model.utcnow())
    assert {s: n for s, n in counts.items() if n} == dict(Counter(r["state"] for r in records)) == {
        "available": 20, "active": 100}


async def test_a_commit_whose_record_was_written_again_is_told_it_lost_and_the_others_go_together_once_more(raw_store):
    """A commit of a batch that lost whose record the store shows written again since it was read (at
    a revision past the one it expects) surely lost: told so without a batch of its own (under load,
    hundreds of such batches of one held every count-moving commit behind them for seconds), and the
    others go together once more."""
    job = jobs_of("l", "lost")
    store, tallied, made = await ten_made(raw_store, job)
    before = store.batches
    moved = await tallied.commit_each([[Write(f"l{n}", job(n, "active"), made[n][0] - (n == 3), before=job(n, "available"))]
                                       for n in range(10)])  # l3 on a revision it is no longer at
    assert [isinstance(m, Conflict) for m in moved] == [n == 3 for n in range(10)], moved
    assert store.batches - before == 2  # the ten, then the nine together; l3 told at once
    counts = tally.summed([r for r, _ in await raw_store.scan(tally.prefix("lost"))], model.utcnow())
    assert {s: n for s, n in counts.items() if n} == {"available": 1, "active": 9}


async def test_a_commit_whose_record_a_lagging_read_shows_behind_goes_alone_to_hear_its_outcome():
    """Which commit lost, only each alone can tell when the records read show none written again: a
    replica that lags shows a record before the revision its write expects, which decides nothing.
    So that one goes alone, and the others together once more."""
    job = jobs_of("r", "replica")
    raw = MemoryJobStore()
    store, tallied, made = await ten_made(raw, job)
    raw.lag()  # from here the reads see every record as made
    [read] = await tallied.commit([Write("r3", job(3, "available") | {"note": 1}, made[3][0], before=job(3, "available"))])
    await tallied.commit([Write("r3", job(3, "available") | {"note": 2}, read, before=job(3, "available"))])  # written again
    before = store.batches
    moved = await tallied.commit_each([[Write(f"r{n}", job(n, "active"), read if n == 3 else made[n][0],
                                              before=job(n, "available"))] for n in range(10)])
    raw.catch_up()
    assert [isinstance(m, Conflict) for m in moved] == [n == 3 for n in range(10)], moved
    assert store.batches - before == 3  # the ten, then the nine together, then r3 alone


async def test_a_lost_compare_and_set_is_told_to_its_commit_when_the_records_cannot_be_read():
    """The read that sets a batch's losers apart is a hint: without it, each commit goes alone."""
    class Unreadable(Counted):
        async def get_many(self, keys):
            raise ConnectionError("NATS away")

    job = jobs_of("u", "unread")
    store, tallied, made = await ten_made(MemoryJobStore(), job, Unreadable)
    before = store.batches
    moved = await asyncio.wait_for(tallied.commit_each(  # a liveness bound only
        [[Write(f"u{n}", job(n, "active"), made[n][0] - (n == 3), before=job(n, "available"))] for n in range(10)]), 30)
    assert [isinstance(m, Conflict) for m in moved] == [n == 3 for n in range(10)], moved
    assert store.batches - before == 11  # the ten, then each alone


async def test_commits_that_come_while_a_batch_is_on_its_way_go_next_as_one():
    """One batch on its way at a time: on one node each atomic batch costs nats-server its staging
    whatever it holds, so what comes meanwhile waits and goes next as one batch, not one each. (On the
    memory store, which never waits on I/O: what is tested is when Tallied sends, not what a store does.)"""
    raw_store = MemoryJobStore()
    store, gate = Counted(raw_store), asyncio.Event()
    tallied = Tallied(store)
    sent = store.commit

    async def held_first(writes):
        if store.batches == 0:
            store.batches += 1
            await gate.wait()
            return await raw_store.commit(writes)
        return await sent(writes)
    store.commit = held_first

    def job(n: int) -> dict:
        return {"id": f"n{n}", "queue": "next", "state": "available"}

    first = asyncio.create_task(tallied.commit([Write("n0", job(0))]))
    await every_task_ran()
    rest = [asyncio.create_task(tallied.commit([Write(f"n{n}", job(n))])) for n in range(1, 11)]
    await every_task_ran()
    assert store.batches == 1 and not any(task.done() for task in rest)  # waiting behind the first
    gate.set()
    assert all(await asyncio.gather(first, *rest)) and store.batches == 2
    counts = tally.summed([r for r, _ in await raw_store.scan(tally.prefix("next"))], model.utcnow())
    assert {s: n for s, n in counts.items() if n} == {"available": 11}


async def test_a_commit_that_may_wait_rides_with_the_next_one_or_goes_alone_when_its_time_is_up(raw_store):
    """A worker's ack (Write.may_wait) is held for the next commit, and shares its batch; with none
    coming, it goes when its time is up."""
    store = Counted(raw_store)
    tallied = Tallied(store)
    loop = asyncio.get_running_loop()

    def job(key: str, state: str) -> dict:
        return {"id": key, "queue": "waits", "state": state}

    [first] = await tallied.commit([Write("w1", job("w1", "available"))])
    held = asyncio.create_task(tallied.commit([Write("w1", job("w1", "active"), first, before=job("w1", "available"),
                                                     may_wait=30.0)]))
    await asyncio.sleep(0.3)
    assert not held.done() and store.batches == 1  # held, not sent
    await tallied.commit([Write("w2", job("w2", "available"))])  # goes at once, and takes the held one along
    assert held.done() and store.batches == 2

    started = loop.time()
    [alone] = await tallied.commit([Write("w2", job("w2", "active"), (await raw_store.get("w2")).revision,
                                          before=job("w2", "available"), may_wait=0.5)])
    assert 0.5 <= loop.time() - started < 30 and store.batches == 3 and alone
    counts = tally.summed([r for r, _ in await raw_store.scan(tally.prefix("waits"))], model.utcnow())
    assert {s: n for s, n in counts.items() if n} == {"active": 2}


def test_commits_that_may_wait_go_when_their_time_is_up_on_uvloop_too():
    """uvloop hands back a plain handle, which cannot say when it is due, for a timer due within its
    millisecond: a native worker run on uvloop had its acks refused with an AttributeError."""
    import uvloop  # with the http extra, which make install installs

    async def main() -> list[list[int]]:
        tallied = Tallied(MemoryJobStore())
        keys = [f"u{n}" for n in range(200)]
        made = [await tallied.commit([Write(k, {"id": k, "queue": "uv", "state": "available"})]) for k in keys]
        return await asyncio.wait_for(asyncio.gather(*(tallied.commit([Write(
            k, {"id": k, "queue": "uv", "state": "active"}, rev, before={"id": k, "queue": "uv", "state": "available"},
            may_wait=0.0001)]) for k, [rev] in zip(keys, made))), 5)
    assert [len(r) for r in uvloop.run(main())] == [1] * 200


async def test_commits_given_together_go_as_one_batch_and_each_hears_its_own_outcome(raw_store):
    """`commit_each` (a native worker's acks, seamq.jobs.completions): the commits share a batch with no
    task each, and one that moves no count goes alone; one whose CAS loses hears Conflict, and no other."""
    job = jobs_of("e", "each")
    store, tallied, made = await ten_made(raw_store, job)
    before = store.batches
    moved = await tallied.commit_each([[Write(f"e{n}", job(n, "active"), made[n][0], before=job(n, "available"))]
                                       for n in range(6)] + [[Write("cron.each", {"_key": "cron.each"})]])
    assert all(isinstance(m, list) for m in moved), moved
    assert store.batches - before == 2  # the six in one batch, the write that moves no count alone
    moved = await tallied.commit_each([[Write(f"e{n}", job(n, "active"), made[n][0] - (n == 8), before=job(n, "available"))]
                                       for n in range(6, 10)])
    assert [type(m) for m in moved] == [list, list, Conflict, list], moved
    counts = tally.summed([r for r, _ in await raw_store.scan(tally.prefix("each"))], model.utcnow())
    assert {s: n for s, n in counts.items() if n} == {"available": 1, "active": 9}
