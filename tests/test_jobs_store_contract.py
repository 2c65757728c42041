"""The job store port (seamq.jobs.ports): what every store must do, checked against each one (the
in-memory store now; the NATS store joins when the stateless engine lands), as River's drivers pass
one shared suite. Time passes through `later`: the memory store's clock moves, NATS' would be slept."""

from __future__ import annotations

from datetime import timedelta

import pytest

from seamq.jobs.memory_store import MemoryJobStore
from seamq.jobs.ports import Conflict, Write


@pytest.fixture(params=["memory"])
def store(request):
    return MemoryJobStore()


async def later(store, seconds: float) -> None:
    store.clock.advance(seconds)


async def test_writes_are_compare_and_set_and_a_batch_is_all_or_none(store):
    [first] = await store.commit([Write("a", {"n": 1})])
    with pytest.raises(Conflict):
        await store.commit([Write("a", {"n": 2})])  # creating a key that exists
    [second] = await store.commit([Write("a", {"n": 2}, first)])
    with pytest.raises(Conflict):
        await store.commit([Write("a", {"n": 3}, first)])  # a revision someone else moved past
    with pytest.raises(Conflict):
        await store.commit([Write("b", {"n": 1}), Write("a", {"n": 4}, first)])
    assert await store.get("b") is None and await store.get("a") == ({"n": 2}, second)
    await store.delete("a")
    assert await store.get("a") is None


async def test_entries_come_by_priority_then_first_in_first_out(store):
    for n, priority in enumerate([0, 5, 0, 5, -3]):
        await store.offer("q", priority, f"j{n}", n + 1)
    await store.offer("other", 9, "x", 9)
    assert await store.waiting("q") == {0: 2, 5: 2, -3: 1}
    taken = await store.take("q", 10, 30)
    assert [t.job_id for t in taken] == ["j1", "j3", "j0", "j2", "j4"]
    assert [t.revision for t in taken] == [2, 4, 1, 3, 5] and {t.deliveries for t in taken} == {1}
    assert await store.take("q", 10, 30) == [] and await store.waiting("q") == {}


async def test_a_held_entry_comes_again_when_its_hold_runs_out_unless_extended_or_settled(store):
    for n in range(3):
        await store.offer("q", 0, f"j{n}", n + 1)
    a, b, c = await store.take("q", 3, 10)
    await later(store, 6)
    await store.hold(b.hold, 10)  # a heartbeat
    await store.settle(c.hold)  # its job finished
    assert await store.take("q", 3, 10) == []  # all three still held
    await later(store, 5)  # a's hold ran out; b's runs 5 more seconds
    [again] = await store.take("q", 3, 10)
    assert (again.job_id, again.deliveries) == ("j0", 2) and again.hold != a.hold
    await later(store, 6)
    assert [t.job_id for t in await store.take("q", 3, 10)] == ["j1"]


async def test_entries_that_come_again_go_before_later_ones(store):
    await store.offer("q", 0, "early", 1)
    [held] = await store.take("q", 1, 5)
    await store.offer("q", 0, "late", 2)
    await later(store, 6)
    assert [t.job_id for t in await store.take("q", 2, 5)] == ["early", "late"]


async def test_timers_fire_once_at_their_time_and_a_new_one_replaces_the_old(store):
    start = store.clock()
    await store.arm("run", "j1", start + timedelta(seconds=10), {"attempt": 1})
    await store.arm("run", "j1", start + timedelta(seconds=20), {"attempt": 2})  # replaces
    await store.arm("expire", "j1", start + timedelta(seconds=15), {})
    await store.arm("run", "j2", start + timedelta(seconds=5), {})
    await store.disarm("run", "j2")
    await later(store, 16)
    [expire] = await store.fired(10, 0)
    assert (expire.kind, expire.key) == ("expire", "j1")
    await store.done(expire)
    await later(store, 5)
    [run] = await store.fired(10, 0)
    assert run.token == {"attempt": 2}
    assert await store.fired(10, 0) == []  # handed out: not again while its server works on it
    await later(store, 31)
    [again] = await store.fired(10, 0)  # that server never said done
    assert again.key == "j1" and again.kind == "run"
    await store.done(again)
    await later(store, 60)
    assert await store.fired(10, 0) == []
