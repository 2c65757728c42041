"""The NATS ready order's take (seamq.jobs.nats_ready): the queue's priorities and lanes are read as last
stored beside the pull of the highest priority this server knows. A server that has not heard yet of a
priority or a lane another server made (its watch lags) still takes in the order stored, and what its
first pull took goes back at once (delivered again before any later entry of its lane, within
moments rather than after TAKEN_HOLD)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from seamq.jobs.nats_store import NatsJobStore


@pytest.fixture
async def two_servers(nats_server):
    nc = await nats.connect(nats_server.url)
    stores = [await NatsJobStore(nc).start(), await NatsJobStore(nc).start()]
    yield stores
    for store in stores:
        await store.close()
    await nc.close()


async def heard(store, queue: str, priority: int) -> None:
    for _ in range(200):  # a liveness bound only
        if priority in store.ready._priorities.get(queue, ()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{queue} p{priority} never heard of")


async def test_a_priority_not_heard_of_yet_is_taken_first_and_the_pull_beside_it_goes_back(two_servers):
    here, other = two_servers
    await other.offer("prio", 0, "low")
    await other.offer("prio", 5, "high")
    await heard(here, "prio", 5)
    here.ready._priorities["prio"].discard(5)  # as if its watch had not told it yet
    assert [t.job_id for t in await here.take("prio", 1)] == ["high"]
    for _ in range(100):  # a liveness bound only (not given back, it would come after 30 s, TAKEN_HOLD)
        if again := await here.take("prio", 1):
            break
        await asyncio.sleep(0.02)
    assert [(t.job_id, t.deliveries) for t in again] == [("low", 2)]  # taken beside the read, given back


async def test_a_lane_not_heard_of_yet_takes_its_turn(two_servers):
    here, other = two_servers
    await other.offer("lanes", 0, "own")
    await other.offer("lanes", 0, "tenants", "acme")
    await heard(here, "lanes", 0)
    for _ in range(200):  # a liveness bound only
        if "acme" in here.ready._lanes.get(("lanes", 0), ()):
            break
        await asyncio.sleep(0.02)
    here.ready._lanes[("lanes", 0)].discard("acme")  # as if its watch had not told it yet
    first = [t.job_id for t in await here.take("lanes", 2)]
    assert "tenants" in first  # the lane read beside the pull took its turn
    taken = list(first)
    for _ in range(100):  # a liveness bound only: the entry given back comes at once, not after TAKEN_HOLD
        if len(taken) >= 2:
            break
        taken += [t.job_id for t in await here.take("lanes", 2)]
        await asyncio.sleep(0.02)
    assert sorted(taken) == ["own", "tenants"]  # each once
