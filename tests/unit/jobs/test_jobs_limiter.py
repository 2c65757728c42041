"""Rate limit keys through the engine (seamq.jobs.limiter, seamq.jobs.operations) on the in-memory store,
two servers on it and a clock the test moves: permits taken and given back, what a held-back job
becomes by its policy, a handler's `rate_limit_until`, an override by hand, a permit left by a kill."""

from __future__ import annotations

from datetime import timedelta

import pytest

from seamq.jobs import limiter, limits
from seamq.jobs.engine import Engine
from seamq.jobs.job import from_record
from seamq.jobs.model import iso
from seamq.jobs.ports import Write


async def push(engine: Engine, count: int, **limit) -> list[str]:
    body = {"type": "t.call", "args": [], "options": {"queue": "q", "rate_limit": {"key": "api", **limit}}}
    return [(await engine.ops.push(body))[1]["id"] for _ in range(count)]


async def test_a_concurrency_limit_holds_across_servers_and_an_end_gives_its_permit_back(servers, clock):
    one, other = servers
    await push(one, 3, concurrency=2)
    first = await one.ops.fetch(["q"], 3, "w1")
    assert len(first) == 2 and await other.ops.fetch(["q"], 3, "w2") == []
    assert (await other.limiter.inspect("api"))["concurrency"] == {"limit": 2, "active": 2, "available": 0}
    held = await store_record(other, "api")
    assert sorted(held["active"]) == sorted(j["id"] for j in first)
    await other.ops.ack(first[0]["id"], None)  # acked through the other server
    clock.advance(limits.CONCURRENCY_WAIT_MOST_MS * 2 / 1000)  # the held-back entry comes again
    assert len(await other.ops.fetch(["q"], 3, "w2")) == 1
    assert (await one.limiter.inspect("api"))["concurrency"]["active"] == 2


async def test_a_lease_that_runs_out_gives_the_permit_to_the_next_attempt_not_a_second_one(servers, clock):
    one, other = servers
    [job_id] = await push(one, 1, concurrency=1)
    assert len(await one.ops.fetch(["q"], 1, "w1", 1000)) == 1
    clock.advance(31)  # the lease (1 s) and the entry's hold ran out: the job comes again
    again = await other.ops.fetch(["q"], 1, "w2")
    assert [(j["id"], j["attempt"]) for j in again] == [(job_id, 2)]
    assert list((await store_record(one, "api"))["active"]) == [job_id]


async def test_a_job_held_back_waits_is_rescheduled_or_dropped_as_its_policy_says(servers, clock):
    one, _ = servers
    waiting = await push(one, 2, concurrency=1)
    later = await push(one, 1, concurrency=1, on_limit="reschedule")
    dropped = await push(one, 1, concurrency=1, on_limit="drop")
    got = await one.ops.fetch(["q"], 4, "w1")
    assert [j["id"] for j in got] == waiting[:1]
    assert (await one.ops.info(waiting[1]))["state"] == "available"
    moved = await one.ops.info(later[0])
    assert moved["state"] == "scheduled" and moved["scheduled_at"] > iso(clock())
    gone = await one.ops.info(dropped[0])
    assert gone["state"] == "discarded" and gone["error"]["code"] == "rate_limited"
    assert "concurrency" in gone["error"]["message"] and "api" in gone["error"]["message"]
    told = [e for e in (await one.events.list([], [], 100))["events"] if e["type"].startswith("rate_limit.")]
    assert {(e["type"], e["data"]["on_limit"]) for e in told} >= {("rate_limit.exceeded", "wait"),
                                                                ("rate_limit.exceeded", "reschedule"),
                                                                ("rate_limit.dropped", "drop")}


async def test_a_handler_saying_rate_limit_until_holds_its_key_until_then(servers, clock):
    one, other = servers
    await push(one, 2, concurrency=5)
    [job] = await one.ops.fetch(["q"], 1, "w1")
    until = clock() + timedelta(seconds=60)
    await one.ops.nack(job["id"], {"message": "the partner said 429", "rate_limit_until": iso(until)})
    assert await other.ops.fetch(["q"], 2, "w2") == []
    clock.advance(45)
    assert await other.ops.fetch(["q"], 2, "w2") == []
    clock.advance(60)
    assert len(await other.ops.fetch(["q"], 2, "w2")) >= 1


async def test_an_override_by_hand_holds_a_key_until_it_is_ended(servers, clock):
    one, other = servers
    await push(one, 1, concurrency=5)
    shown = await one.limiter.override("api", {"concurrency": 0, "expires_at": iso(clock() + timedelta(hours=1))})
    assert shown["concurrency"]["limit"] == 0
    assert await other.ops.fetch(["q"], 1, "w2") == []
    await other.limiter.override("api", {"concurrency": None})
    clock.advance(limits.CONCURRENCY_WAIT_MOST_MS * 2 / 1000)
    assert len(await one.ops.fetch(["q"], 1, "w1")) == 1
    for bad in ({"concurrency": -1}, {"concurrency": 1, "extra": 1}, {}, {"concurrency": 1, "expires_at": 5}):
        with pytest.raises(Exception) as refused:
            await one.limiter.override("api", bad)
        assert getattr(refused.value, "status", None) == 400


async def test_a_permit_left_by_a_server_killed_before_its_claim_is_dropped_when_the_key_is_full(servers, store, clock):
    one, _ = servers
    [job_id] = await push(one, 1, concurrency=1)
    ghost = int((clock() - timedelta(seconds=60)).timestamp() * 1000)  # a permit taken a minute ago, never used
    held = await store.get(limits.record_key("api"))
    await store.commit([Write(limits.record_key("api"), {**held.record, "active": {"01-never-claimed": [1, ghost]}},
                              held.revision, finished=True)])
    got = await one.ops.fetch(["q"], 1, "w1")
    assert [j["id"] for j in got] == [job_id]
    assert list((await store_record(one, "api"))["active"]) == [job_id]


async def test_a_keys_crowd_counts_each_job_held_back_here_once_and_forgets_it_after_a_while(servers, clock):
    one, _ = servers
    ids = await push(one, 6, rate={"limit": 1, "period": "PT1M"})
    jobs = [from_record((await one.store.get(job_id)).record) for job_id in ids]
    assert (await one.limiter.admit(jobs[0], clock())).wait_ms == 0
    crowds = [(await one.limiter.admit(job, clock())).crowd for job in jobs[1:] + jobs[1:3]]
    assert crowds == [1, 2, 3, 4, 5, 5, 5], "a job looked at again is not counted twice"
    clock.advance(limiter.CROWD_SPAN + 1)
    assert (await one.limiter.admit(jobs[5], clock())).crowd == 1, "the others were not held back lately"


async def store_record(engine: Engine, key: str) -> dict:
    held = await engine.store.get(limits.record_key(key))
    assert held is not None
    return held.record
