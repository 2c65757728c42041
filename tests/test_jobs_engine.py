"""The OJS engine against a real nats-server: exclusive claims, records in KV, timers that survive."""

from __future__ import annotations

import asyncio

import pytest

from seamq.jobs.engine import Engine
from seamq.jobs.model import OjsError
from seamq.jobs.nats_store import NatsJobStore


@pytest.fixture
async def engine(nc):
    store = await NatsJobStore(nc).start()
    engine = await Engine(store, test_mode=True).start()
    yield engine
    await engine.stop()


async def test_fifty_concurrent_fetches_claim_one_job_exactly_once(engine):
    _, job = await engine.push({"type": "a.b", "args": [], "options": {"queue": "one"}})
    results = await asyncio.gather(*(engine.fetch(["one"], worker_id=f"w{i}") for i in range(50)))
    winners = [r for r in results if r]
    assert len(winners) == 1 and winners[0][0]["id"] == job["id"] and winners[0][0]["attempt"] == 1
    assert sum(len(r) == 0 for r in results) == 49


async def test_two_engines_on_one_store_claim_a_job_once(nc, engine):
    """Two servers fetching the same queue at once: one gets the job, the other answers nothing."""
    _, job = await engine.push({"type": "a.b", "args": [], "options": {"queue": "shared"}})
    other = await Engine(await NatsJobStore(nc).start()).start()
    try:
        first, second = await asyncio.gather(engine.fetch(["shared"]), other.fetch(["shared"]))
    finally:
        await other.stop()
    assert sorted([len(first), len(second)]) == [0, 1]
    assert (first or second)[0]["id"] == job["id"]


async def test_wrong_transitions_are_conflicts_and_unknown_ids_not_found(engine):
    _, job = await engine.push({"type": "a.b", "args": []})
    with pytest.raises(OjsError) as refused:
        await engine.ack(job["id"])
    assert refused.value.status == 409
    with pytest.raises(OjsError) as missing:
        await engine.info("01961111-aaaa-7bbb-8ccc-dddddddddddd")
    assert missing.value.status == 404


async def test_a_lease_that_runs_out_is_a_failed_attempt_in_the_history(engine):
    """No ack, nack or heartbeat within the visibility timeout: the job goes back to its queue, and the
    attempt that ended without a verdict is kept in its errors (every failed attempt is visible)."""
    _, job = await engine.push({"type": "a.b", "args": [], "options": {"queue": "lease"}})
    [held] = await engine.fetch(["lease"], worker_id="w-gone", visibility=200)
    for _ in range(200):
        if (await engine.info(job["id"]))["state"] == "available":
            break
        await asyncio.sleep(0.05)
    back = await engine.info(job["id"])
    assert back["state"] == "available" and held["attempt"] == 1
    assert [(e["code"], e["type"], e["attempt"]) for e in back["errors"]] == [("lease_expired", "LeaseExpired", 1)]
    assert "w-gone" in back["errors"][0]["message"]
    [again] = await engine.fetch(["lease"], worker_id="w-2")
    assert again["attempt"] == 2
    assert (await engine.ack(again["id"]))["state"] == "completed"
