"""The OJS engine against a real nats-server: exclusive claims, records in KV, timers that survive."""

from __future__ import annotations

import asyncio

import pytest

from seamq.jobs.engine import Engine
from seamq.jobs.model import OjsError
from seamq.jobs.store import JobStore


@pytest.fixture
async def engine(nc):
    store = await JobStore(nc).start()
    engine = await Engine(store, test_mode=True).start()
    yield engine
    await engine.stop()


async def test_fifty_concurrent_fetches_claim_one_job_exactly_once(engine):
    _, job = await engine.push({"type": "a.b", "args": [], "options": {"queue": "one"}})
    results = await asyncio.gather(*(engine.fetch(["one"], worker_id=f"w{i}") for i in range(50)))
    winners = [r for r in results if r]
    assert len(winners) == 1 and winners[0][0]["id"] == job["id"] and winners[0][0]["attempt"] == 1
    assert sum(len(r) == 0 for r in results) == 49


async def test_two_engines_on_one_bucket_claim_a_job_once(nc, engine):
    """The CAS, not the in-process index, makes a claim exclusive: a second engine on the same
    records (as after a restart, or a second instance) loses the race and answers nothing."""
    _, job = await engine.push({"type": "a.b", "args": [], "options": {"queue": "shared"}})
    other = await Engine(await JobStore(nc).start()).start()
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
        engine.info("01961111-aaaa-7bbb-8ccc-dddddddddddd")
    assert missing.value.status == 404
