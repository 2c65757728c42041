"""Engine v2's operations (seamq.jobs.operations) on the in-memory store and a clock the test moves:
every transition and timer rule, with two servers on one store, in well under a second."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from seamq.jobs.memory_store import Clock, MemoryJobStore
from seamq.jobs.model import OjsError
from seamq.jobs.operations import Operations


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(clock):
    return MemoryJobStore(clock)


@pytest.fixture
def ops(store, clock):
    return Operations(store, clock=clock, rng=random.Random(1))


def job(job_type: str = "t.run", queue: str = "q", **options) -> dict:
    return {"type": job_type, "args": [], "options": {"queue": queue, **options}}


async def test_fetch_takes_by_priority_then_in_order_and_each_job_once_across_two_servers(ops, store, clock):
    other = Operations(store, clock=clock)
    ids = [(await ops.push(job(priority=p)))["id"] for p in (0, 5, 0, 5)]
    got = await ops.fetch(["q"], 2, "w1") + await other.fetch(["q"], 5, "w2")
    assert [j["id"] for j in got] == [ids[1], ids[3], ids[0], ids[2]]
    assert [j["attempt"] for j in got] == [1, 1, 1, 1] and await ops.fetch(["q"], 5, "w3") == []
    with pytest.raises(OjsError) as duplicate:
        await ops.push({**job(), "id": ids[0]})
    assert duplicate.value.status == 409 and duplicate.value.code == "duplicate"


async def test_an_ack_ends_the_job_and_its_entry_never_comes_again(ops, clock):
    pushed = await ops.push(job())
    [got] = await ops.fetch(["q"], 1, "w", visibility_ms=1000)
    done = await ops.ack(got["id"], {"ok": True})
    assert done["state"] == "completed" and done["result"] == {"ok": True}
    clock.advance(5)
    assert await ops.fetch(["q"], 1, "w") == []
    with pytest.raises(OjsError) as again:
        await ops.ack(pushed["id"])
    assert again.value.status == 409


async def test_a_failure_retries_after_its_backoff_then_is_dead_lettered(ops, clock):
    retry = {"max_attempts": 2, "initial_interval": "PT10S", "jitter": False, "on_exhaustion": "dead_letter"}
    pushed = await ops.push(job(retry=retry))
    [got] = await ops.fetch(["q"], 1, "w")
    failed = await ops.nack(got["id"], {"type": "Timeout", "message": "slow"})
    assert failed["state"] == "retryable" and failed["retry_delay_ms"] == 10_000
    clock.advance(9)
    assert await ops.tick() == 0 and await ops.fetch(["q"], 1, "w") == []
    clock.advance(1)
    assert await ops.tick() == 1
    [again] = await ops.fetch(["q"], 1, "w")
    assert again["attempt"] == 2
    last = await ops.nack(again["id"], {"type": "Timeout", "message": "slower"})
    assert last["state"] == "discarded" and [e["attempt"] for e in last["errors"]] == [1, 2]
    assert (await ops.load(pushed["id"]))[0].dead_letter


async def test_a_lease_that_runs_out_comes_back_to_another_worker_with_the_attempt_in_the_history(ops, store, clock):
    other = Operations(store, clock=clock)
    await ops.push(job())
    [got] = await ops.fetch(["q"], 1, "w-gone", visibility_ms=1000)
    clock.advance(0.5)
    assert await other.fetch(["q"], 1, "w2", visibility_ms=1000) == []
    clock.advance(1)
    [again] = await other.fetch(["q"], 1, "w2", visibility_ms=1000)
    assert again["id"] == got["id"] and again["attempt"] == 2 and again["worker_id"] == "w2"
    assert [(e["code"], e["attempt"]) for e in again["errors"]] == [("lease_expired", 1)]
    assert (await other.ack(again["id"]))["state"] == "completed"


async def test_heartbeats_keep_the_lease_and_name_a_cancelled_job(ops, clock):
    first, second = [(await ops.push(job()))["id"] for _ in range(2)]
    await ops.fetch(["q"], 2, "w", visibility_ms=1000)
    for _ in range(5):
        clock.advance(0.8)
        answer = await ops.heartbeat("w", [first, second], visibility_ms=1000)
        assert answer["jobs_extended"] == [first, second]
    assert await ops.fetch(["q"], 2, "thief", visibility_ms=1000) == []
    await ops.cancel(second)
    answer = await ops.heartbeat("w", [first, second], visibility_ms=1000)
    assert answer == {"jobs_extended": [first], "jobs_cancelled": [second]}
    clock.advance(10)  # the first's lease (no more heartbeats) ran out; the cancelled one's entry is gone
    [back] = await ops.fetch(["q"], 2, "w2")
    assert back["id"] == first


async def test_scheduled_jobs_wait_for_their_time_and_expired_ones_never_run(ops, clock):
    later = (clock() + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    scheduled = await ops.push(job(scheduled_at=later))
    gone = await ops.push(job(queue="e", expires_at="+PT30S"))
    assert scheduled["state"] == "scheduled" and await ops.fetch(["q"], 1, "w") == []
    clock.advance(31)
    await ops.tick()
    assert (await ops.info(gone["id"]))["state"] == "discarded" and await ops.fetch(["e"], 1, "w") == []
    clock.advance(30)
    await ops.tick()
    [now] = await ops.fetch(["q"], 1, "w")
    assert now["id"] == scheduled["id"]


async def test_a_job_over_its_timeout_fails_once_even_if_the_timer_comes_twice(ops, store, clock):
    await ops.push(job(timeout_ms=2000, retry={"max_attempts": 1}))
    [got] = await ops.fetch(["q"], 1, "w")
    clock.advance(2)
    [timer] = await store.fired(10, 0)
    await ops.fire(timer)
    await ops.fire(timer)  # handed out twice (a server died before it said done)
    failed = await ops.info(got["id"])
    assert failed["state"] == "discarded" and [e["code"] for e in failed["errors"]] == ["timeout"]


async def test_a_requeue_releases_the_job_at_once_without_using_up_attempts(ops):
    await ops.push(job(retry={"max_attempts": 1}))
    [got] = await ops.fetch(["q"], 1, "w")
    released = await ops.nack(got["id"], {"code": "worker_stopped", "message": "stopping"}, requeue=True)
    assert released["state"] == "available"
    [again] = await ops.fetch(["q"], 1, "w2")
    assert again["attempt"] == 2 and (await ops.ack(again["id"]))["state"] == "completed"


async def test_an_ack_to_a_server_whose_copy_is_stale_reads_the_job_and_is_refused_if_it_moved_on(ops, store, clock):
    other = Operations(store, clock=clock)
    pushed = await ops.push(job())
    await ops.fetch(["q"], 1, "w")  # this server keeps its copy of the running job
    await other.cancel(pushed["id"])  # another server cancels it
    with pytest.raises(OjsError) as refused:
        await ops.ack(pushed["id"])
    assert refused.value.status == 409 and "cancelled" in refused.value.message
    pushed_again = await ops.push(job())
    [got] = await other.fetch(["q"], 1, "w2")
    assert (await ops.ack(got["id"]))["state"] == "completed"  # acked at a server that never held it
    assert pushed_again["id"] == got["id"]
