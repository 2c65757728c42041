"""A job's timer that cannot do its work when it comes (its change not stored yet, the store failing,
a compare-and-set lost) comes again soon and for minutes: a job due is never left waiting for a timer
that gave up, nor for the store's half-minute hold of one it did not answer. Found reading the timer's
paths after a clean-clone CI run on a busy machine did not fetch a job due 1 s ahead in a minute."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from structlog.testing import capture_logs

from seamq.jobs.engine import EARLY_TIMER, EARLY_TIMER_TRIES
from seamq.jobs.memory_store import ACK_WAIT

from helpers.engines import every_task_ran, gated, job, push


async def scheduled(engine, clock) -> str:
    """A job due 60 s from now, and the clock moved to its time."""
    later = (clock() + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    pushed = await push(engine, job(scheduled_at=later))
    clock.advance(60)
    return pushed["id"]


async def test_a_timer_whose_firing_fails_comes_again_in_half_a_second_not_after_the_stores_hold(engine, store, clock):
    job_id = await scheduled(engine, clock)
    get = store.get

    async def failing_once(key):
        store.get = get
        raise ConnectionError("nats: timeout")
    store.get = failing_once
    with capture_logs() as logs:
        assert await engine.tick() == 1
    assert [(e["event"], e["kind"]) for e in logs if e["log_level"] == "error"] == [("ojs_timer_failed", "scheduled")]
    assert (await engine.ops.info(job_id))["state"] == "scheduled"
    clock.advance(EARLY_TIMER.delay(1))
    assert EARLY_TIMER.delay(1) == 0.5 < ACK_WAIT.total_seconds()
    assert await engine.tick() == 1
    assert [j["id"] for j in await engine.ops.fetch(["q"], 5, "w")] == [job_id]


async def test_a_timer_that_comes_minutes_before_its_push_is_stored_moves_the_job_once_it_is(engine, store, clock):
    gate = gated(store)  # the push's batch on its way to NATS, for three minutes
    later = (clock() + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    pushing = asyncio.create_task(push(engine, job(scheduled_at=later)))
    await every_task_ran()  # its timer armed, its record not stored
    fired = 0
    for _ in range(180):
        clock.advance(1)
        fired += await engine.tick()
    assert fired >= 10  # came, found no job, and came again
    gate.set()
    job_id = (await pushing)["id"]
    clock.advance(EARLY_TIMER.cap)
    assert await engine.tick() == 1
    assert [j["id"] for j in await engine.ops.fetch(["q"], 5, "w")] == [job_id]


async def test_a_timer_whose_move_loses_its_compare_and_set_decides_again_on_the_job_as_it_is(engine, store, clock):
    job_id = await scheduled(engine, clock)
    commit = store.commit

    async def changed_first(writes):  # the job's record written by someone else just before
        store.commit = commit
        held = await store.get(job_id)
        await commit([type(writes[0])(job_id, held.record, held.revision)])
        return await commit(writes)
    store.commit = changed_first
    assert await engine.tick() == 1
    assert (await engine.ops.info(job_id))["state"] == "scheduled"  # its move lost, and was not taken as done
    clock.advance(EARLY_TIMER.delay(1))
    assert await engine.tick() == 1
    assert [j["id"] for j in await engine.ops.fetch(["q"], 5, "w")] == [job_id]


async def test_a_timer_whose_push_never_came_is_let_go_after_its_tries_and_that_is_said(engine, store, clock):
    await store.arm("scheduled", "q.0192e2e4-0000-7000-8000-000000000000", clock(), {"attempt": 0})
    fired = 0
    with capture_logs() as logs:
        for _ in range(3 * EARLY_TIMER_TRIES):
            fired += await engine.tick()
            clock.advance(EARLY_TIMER.cap)
    assert fired == EARLY_TIMER_TRIES
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["ojs_timer_dropped"]
    assert not store.timers and not store.handed
