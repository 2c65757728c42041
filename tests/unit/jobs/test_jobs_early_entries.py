"""An entry taken before its record: a change writes the job's entry first, then its record, so a
fetch between the two meets a job that is not yet available. It must neither claim it nor drop the
entry, and the job must not wait long once its record is stored (timer lateness, docs/benchmarks.md 7u)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from seamq.jobs.operations import EARLY_ENTRY, EARLY_ENTRY_TRIES

from helpers.engines import every_task_ran, gated, job, push


async def test_a_fetch_that_meets_an_entry_whose_record_is_on_its_way_here_waits_for_it(engine, store):
    """The change is this server's: the fetch claims the job once its record is stored, in the same
    fetch, rather than holding the entry (which cost a job that fell due up to 130 ms)."""
    gate = gated(store)
    pushing = asyncio.create_task(push(engine, job()))
    await every_task_ran()  # its entry offered, its record on its way
    fetching = asyncio.create_task(engine.ops.fetch(["q"], 5, "w"))
    await every_task_ran()
    assert not fetching.done()  # waiting for the record, not answered empty
    gate.set()
    pushed = await pushing
    assert [j["id"] for j in await fetching] == [pushed["id"]]


async def test_an_entry_met_before_another_servers_record_comes_again_soon(servers, store, clock):
    """The change is another server's, which this one cannot wait for: the entry comes again
    EARLY_ENTRY's first delay later (10 ms), and the job is claimed then."""
    one, other = servers
    gate = gated(store)
    pushing = asyncio.create_task(push(one, job()))
    await every_task_ran()
    assert await other.ops.fetch(["q"], 5, "w") == []
    gate.set()
    pushed = await pushing
    assert EARLY_ENTRY.delay(1) == 0.01
    assert await other.ops.fetch(["q"], 5, "w") == []  # held for now
    clock.advance(0.01)
    assert [j["id"] for j in await other.ops.fetch(["q"], 5, "w")] == [pushed["id"]]


async def test_an_entry_taken_before_its_record_is_stored_comes_again_rather_than_being_dropped(engine, store, clock):
    """Found by the bench, 2026-11-25: scheduled jobs that fell due were sometimes never run."""
    later = (clock() + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    pushed = await push(engine, job(scheduled_at=later))
    await store.offer("q", 0, pushed["id"])  # what `due` writes first, its record not stored yet
    assert await engine.ops.fetch(["q"], 5, "w") == []
    clock.advance(60)
    await engine.tick()  # now stored (with an entry of its own)
    got = await engine.ops.fetch(["q"], 5, "w")
    for _ in range(2 * EARLY_ENTRY_TRIES):  # the early entry comes again, finds it claimed, and is dropped in the end
        clock.advance(EARLY_ENTRY.cap)
        got += await engine.ops.fetch(["q"], 5, "w")
    assert [j["id"] for j in got] == [pushed["id"]]
    assert await store.ready_counts("q") == (0, 1)  # only the running job's own entry is held
