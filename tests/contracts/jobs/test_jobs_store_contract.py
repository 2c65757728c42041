"""The job store port (seamq.jobs.ports): what every store must do, checked against each one, as
River's drivers pass one shared suite: the in-memory store on a clock the test moves, and the NATS
store on a real nats-server, where time is slept (`u` seconds a unit: timers may fire 250 ms late)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from seamq.jobs.memory_store import MemoryJobStore
from seamq.jobs.ports import TAKEN_HOLD, Conflict, Stored, Write


@pytest.fixture(params=["memory", "nats"])
async def store(request):
    if request.param == "memory":
        found = MemoryJobStore()
        found.unit = 1.0
        yield found
        return
    import nats

    from seamq.jobs.nats_store import NatsJobStore

    nc = await nats.connect(request.getfixturevalue("nats_server").url)
    found = await NatsJobStore(nc).start()
    found.unit = 0.5
    yield found
    await found.close()
    await nc.close()


async def later(store, units: float) -> None:
    if isinstance(store, MemoryJobStore):
        store.clock.advance(units * store.unit)
    else:
        await asyncio.sleep(units * store.unit)


async def offer(store, queue: str, priority: int, job_id: str) -> None:
    await store.offer(queue, priority, job_id)


def now(store):
    from seamq.jobs.model import utcnow

    return store.clock() if isinstance(store, MemoryJobStore) else utcnow()


async def test_writes_are_compare_and_set_and_a_batch_is_all_or_none(store):
    [first] = await store.commit([Write("a", {"id": "a", "n": 1})])
    with pytest.raises(Conflict):
        await store.commit([Write("a", {"id": "a", "n": 2})])  # creating a key that exists
    [second] = await store.commit([Write("a", {"id": "a", "n": 2}, first)])
    with pytest.raises(Conflict):
        await store.commit([Write("a", {"id": "a", "n": 3}, first)])  # a revision someone else moved past
    with pytest.raises(Conflict):
        await store.commit([Write("b", {"id": "b", "n": 1}), Write("a", {"id": "a", "n": 4}, first)])
    held = await store.get("a")
    assert isinstance(held, Stored) and await store.get("b") is None and held.revision == second
    record = held.record
    assert {k: v for k, v in record.items() if v is not None} == {"id": "a", "n": 2}  # a job's usual nulls aside
    await store.delete("a")
    assert await store.get("a") is None
    [again] = await store.commit([Write("a", {"id": "a", "n": 5})])  # a deleted key is created anew
    assert (await store.get("a")).revision == again


async def test_commits_sent_together_each_stand_or_fall_alone(store):
    """`commit_each` (a fetch's claims, a worker's acks): each commit all or nothing on its own, a lost
    CAS its own Conflict and no other's, and a deleted key created anew as `commit` creates it."""
    first, second = await store.commit([Write("e1", {"id": "e1", "n": 1}), Write("e2", {"id": "e2", "n": 1})])
    [moved] = await store.commit([Write("e2", {"id": "e2", "n": 2}, second)])
    await store.commit([Write("e3", {"id": "e3", "n": 1})])
    await store.delete("e3")
    outcomes = await store.commit_each([
        [Write("e1", {"id": "e1", "n": 2}, first)],
        [Write("e2", {"id": "e2", "n": 3}, second)],  # a revision someone else moved past
        [Write("e3", {"id": "e3", "n": 2})],
        [Write("e4", {"id": "e4", "n": 1}), Write("e2", {"id": "e2", "n": 4}, second)],  # all or none
    ])
    assert isinstance(outcomes[1], Conflict) and isinstance(outcomes[3], Conflict)
    assert [len(outcomes[0]), len(outcomes[2])] == [1, 1]
    assert [((held := await store.get(key)).record["n"], held.revision) for key in ("e1", "e2", "e3")] == [
        (2, outcomes[0][0]), (2, moved), (2, outcomes[2][0])]
    assert await store.get("e4") is None


async def test_several_records_in_one_read(store):
    revisions = await store.commit([Write(k, {"id": k, "_kind": "t", "n": n}) for n, k in enumerate(("m1", "m2", "m3"))])
    await store.delete("m2")
    found = await store.get_many(["m1", "m2", "m3", "nope"])
    assert {k: (held.record["n"], held.revision) for k, held in found.items()} == {"m1": (0, revisions[0]), "m3": (2, revisions[2])}
    assert all(isinstance(held, Stored) for held in [*found.values(), *await store.scan("")])


async def test_a_read_of_more_records_than_one_request_takes(store):
    """nats-server answers a batched read of more than 1,024 keys with an error: all must still come."""
    keys = [f"many{n}" for n in range(1500)]
    for start in range(0, len(keys), 100):
        await asyncio.gather(*(store.commit([Write(k, {"id": k, "_kind": "t"})]) for k in keys[start:start + 100]))
    assert sorted(await store.get_many(keys)) == sorted(keys)


async def test_entries_come_by_priority_then_first_in_first_out(store):
    for n, priority in enumerate([0, 5, 0, 5, -3]):
        await offer(store, "q", priority, f"j{n}")
    await offer(store, "other", 9, "x")
    assert await store.waiting("q") == {0: 2, 5: 2, -3: 1}
    taken = await store.take("q", 10)
    assert [t.job_id for t in taken] == ["j1", "j3", "j0", "j2", "j4"]
    assert {t.deliveries for t in taken} == {1}
    assert await store.take("q", 10) == []  # all held
    for t in taken:
        await store.settle(t.hold)
    await later(store, 0.2)
    assert await store.waiting("q") == {}


async def test_each_tenant_has_a_lane_taken_alone_or_in_turn_with_the_others(store):
    """Multi-tenancy: a take for a tenant takes from its lane alone; one for every lane gives each lane
    with entries a share, by priority first and in the order offered within a lane."""
    for n in range(6):
        await store.offer("mt", 0, f"a{n}", "acme")
    await store.offer("mt", 0, "b0", "beta.io:eu")
    await store.offer("mt", 0, "n0")
    await store.offer("mt", 5, "a-high", "acme")
    assert [t.job_id for t in await store.take("mt", 10, "beta.io:eu")] == ["b0"]
    assert await store.take("mt", 10, "gamma") == []
    assert [t.job_id for t in await store.take("mt", 1)] == ["a-high"]  # a higher priority first, whoever's
    got = [t.job_id for t in await store.take("mt", 3)]
    assert sorted(got) == ["a0", "a1", "n0"] and got.index("a0") < got.index("a1")  # acme's 6 did not take all 3
    await store.withdraw("mt", 0, "a5", "acme")
    assert await store.take("mt", 10, "") == []  # the lane of jobs with no tenant is empty now
    assert [t.job_id for t in await store.take("mt", 10, "acme")] == ["a2", "a3", "a4"]


async def test_a_held_entry_comes_again_when_its_hold_runs_out_unless_extended_or_settled(store):
    u = store.unit
    for n in range(3):
        await offer(store, "q", 0, f"j{n}")
    a, b, c = await store.take("q", 3)
    for taken in (a, b, c):
        await store.hold(taken.hold, 10 * u)  # as a claim holds an entry for a lease shorter than TAKEN_HOLD
    await later(store, 6)
    await store.hold(b.hold, 10 * u)  # a heartbeat
    await store.settle(c.hold)  # its job finished
    assert await store.take("q", 3) == []  # all three still held
    await later(store, 5)  # a's hold ran out; b's runs 5 more units
    [again] = await store.take("q", 3)
    assert (again.job_id, again.entry, again.deliveries) == ("j0", a.entry, 2) and again.hold != a.hold
    await later(store, 6)
    assert [t.job_id for t in await store.take("q", 3)] == ["j1"]  # `again` is held TAKEN_HOLD


async def test_an_entry_taken_is_held_for_taken_hold_and_then_comes_again(store):
    """TAKEN_HOLD is 30 s: slept on NATS it would be the suite's longest wait, so there the consumer
    that holds the entries is asked for its ack wait, which is that hold."""
    await offer(store, "t", 0, "j")
    [taken] = await store.take("t", 1)
    if isinstance(store, MemoryJobStore):
        await later(store, TAKEN_HOLD - 1)
        assert await store.take("t", 1) == []
        await later(store, 1)
        [again] = await store.take("t", 1)
        assert (again.job_id, again.deliveries) == ("j", 2)
    else:
        from seamq.jobs.nats_ready import READY, _subject

        info = await store.js.consumer_info(READY, await store.ready._consumer(_subject("t", 0)))
        assert info.config.ack_wait == TAKEN_HOLD


async def test_entries_that_come_again_go_before_later_ones(store):
    await offer(store, "q", 0, "early")
    [held] = await store.take("q", 1)
    await store.hold(held.hold, 5 * store.unit)
    await offer(store, "q", 0, "late")
    await later(store, 6)
    assert [t.job_id for t in await store.take("q", 2)] == ["early", "late"]


async def test_a_withdrawn_entry_is_never_taken_and_no_longer_counted(store):
    for n in range(3):
        await offer(store, "w", 0, f"j{n}")
    [held] = await store.take("w", 1)
    await store.hold(held.hold, 5 * store.unit)
    await store.withdraw("w", 0, "j1")  # waiting
    await store.withdraw("w", 0, "j0")  # held: its job was cancelled while it ran
    assert await store.ready_counts("w") == (1, 0)
    await later(store, 6)
    assert [t.job_id for t in await store.take("w", 3)] == ["j2"]


async def test_a_queue_offered_entries_is_listed(store):
    await store.offer("a.b", 0, "j1")
    await store.offer("a", 5, "j2", "acme")
    assert set(await store.queues()) >= {"a", "a.b"}


async def test_a_delete_is_a_write_of_a_batch_by_compare_and_set(store):
    """A job deleted with its tally moved: both or neither (seamq.jobs.tallied)."""
    [job, count] = await store.commit([Write("del.j", {"_kind": "t", "n": 1}), Write("tally.q.x", {"_kind": "t", "n": 1})])
    with pytest.raises(Conflict):
        await store.commit([Write("del.j", None, job + 100), Write("tally.q.x", {"_kind": "t", "n": 0}, count)])
    assert await store.get("del.j") == ({"_kind": "t", "n": 1}, job) and await store.get("tally.q.x") == ({"_kind": "t", "n": 1}, count)
    await store.commit([Write("del.j", None, job), Write("tally.q.x", {"_kind": "t", "n": 0}, count)])
    assert await store.get("del.j") is None and (await store.get("tally.q.x")).record == {"_kind": "t", "n": 0}
    [again] = await store.commit([Write("del.j", {"_kind": "t", "n": 2})])  # the key may be made again
    assert await store.get("del.j") == ({"_kind": "t", "n": 2}, again)


async def test_followers_see_what_is_there_then_each_change(store):
    await store.commit([Write("flag.x", {"_key": "flag.x", "_kind": "flag", "on": True}, None)])
    seen = store.follow(["flag."])
    assert await anext(seen) == ("flag.x", {"_key": "flag.x", "_kind": "flag", "on": True}) and await anext(seen) == ("", None)
    await store.commit([Write("flag.y", {"_key": "flag.y", "_kind": "flag", "on": False}, None), Write("other", {"id": "other"}, None)])
    assert await asyncio.wait_for(anext(seen), 5) == ("flag.y", {"_key": "flag.y", "_kind": "flag", "on": False})
    await store.delete("flag.x")
    assert await asyncio.wait_for(anext(seen), 5) == ("flag.x", None)
    await seen.aclose()


async def test_a_follower_is_told_it_has_all_that_was_there_only_after_the_last_of_it(store):
    """The start is told once every record there has come (a server waits for it before it serves a
    queue its flags may pause), however many and across prefixes, and each time it follows again."""
    await store.commit([Write(f"queue.q{i}", {"_key": f"queue.q{i}", "_kind": "queue"}, None) for i in range(150)])
    await store.commit([Write(f"prio.q{i}", {"_key": f"prio.q{i}", "_kind": "prio"}, None) for i in range(50)])
    for _ in range(20):
        seen, keys = store.follow(["queue.", "prio.", "cron."]), set()
        while (key := (await asyncio.wait_for(anext(seen), 10))[0]) != "":
            keys.add(key)
        assert len(keys) == 200
        await seen.aclose()


async def test_timers_fire_once_at_their_time_and_a_new_one_replaces_the_old(store):
    u, start = store.unit, now(store)
    await store.arm("run", "j1", start + timedelta(seconds=10 * u), {"attempt": 1})
    await store.arm("run", "j1", start + timedelta(seconds=20 * u), {"attempt": 2})  # replaces
    await store.arm("expire", "j1", start + timedelta(seconds=15 * u), {})
    await store.arm("run", "j2", start + timedelta(seconds=5 * u), {})
    await store.disarm("run", "j2")
    await later(store, 17)
    [expire] = await store.fired(10, 0.5)
    assert (expire.kind, expire.key) == ("expire", "j1")
    await store.done(expire)
    await later(store, 5)
    [run] = await store.fired(10, 0.5)
    assert run.token == {"attempt": 2}
    assert await store.fired(10, 0.2) == []  # handed out: not again while its server works on it
    if isinstance(store, MemoryJobStore):  # NATS: the timers consumer's ack wait (30 s) re-hands it
        await later(store, 31)
        [again] = await store.fired(10, 0)
        assert again.key == "j1" and again.kind == "run"
        await store.done(again)
    else:
        await store.done(run)
    await later(store, 3)
    assert await store.fired(10, 0.2) == []


async def test_the_event_log_is_read_from_any_sequence_in_order(store):
    assert await store.log_bounds() == (0, 0) and await store.logged(0, 10) == []
    written = [await store.log(f"{n}\n[]".encode()) for n in range(150)]
    assert written == sorted(written) and len(set(written)) == 150
    assert await store.log_bounds() == (written[0], written[-1])
    first = await store.logged(0, 100)
    assert [seq for seq, _ in first] == written[:100] and first[3][1] == b"3\n[]"
    rest = await store.logged(first[-1][0], 100)
    assert [seq for seq, _ in rest] == written[100:]
    assert await store.logged(written[-1], 100) == []


async def relay(store, data: bytes) -> None:
    """What the relay publishes to `OJS_ENQUEUE` (seamq.jobs.route)."""
    if isinstance(store, MemoryJobStore):
        store.relay(data)
    else:
        from seamq.jobs.route import ROUTE

        await store.nc.jetstream().publish(ROUTE.subject, data)


async def test_a_relayed_job_is_handed_to_one_server_until_done_and_comes_again_when_put_off(store):
    body = b'{"id": "relayed-1", "type": "t.run", "args": []}'
    await relay(store, body)
    [(data, handle)] = await store.taken_in(100, 10)
    assert data == body
    assert await store.taken_in(100, 0.1) == []  # handed to one server
    await store.later(handle, 6 * store.unit)
    assert await store.taken_in(100, 0.1) == []  # not before its delay (3 s on NATS: a busy machine's stall is shorter)
    await later(store, 7)
    [(again, handle)] = await store.taken_in(100, 10)
    assert again == body
    await store.intake_done(handle)
    await later(store, 3)
    assert await store.taken_in(100, 0.1) == []  # done: never again
