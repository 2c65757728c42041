"""Counts left to later (seamq.jobs.recounts), on the in-memory store with a clock the test moves: an
ack that is one plain write bearing a mark is counted where it was, then counted where it is by its
server's marks record (the record not written again), its entry let go after; the counts read through
its server say completed at once; one whose server died before counting it is counted by the fetch
that meets its entry again, and never twice if that server was only slow; one whose write's answer
never came is read back before its number is passed. A job come due is one plain write too, its count
carried on by the claim that usually comes first."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from seamq.jobs import recounts, tally
from seamq.jobs.engine import Engine
from seamq.jobs.ports import TAKEN_HOLD, Conflict

from helpers import wait_for
from helpers.engines import every_task_ran, gated, job, push


@pytest.fixture
async def server(store, clock):
    """A job server's engine: its claims, acks and timers' moves count later."""
    made = await Engine(store, clock=clock, count_claims_later=True, count_acks_later=True).start(clocks=False)
    yield made
    await made.stop()


def counts(stats: dict) -> tuple[int, int, int]:
    return stats["available"], stats["active"], stats["completed"]


def commits_of(store) -> list[list[str]]:
    """The keys of each commit the store is given from now on."""
    written: list[list[str]] = []
    commit = store.commit

    async def seen(writes):
        written.append([w.key for w in writes])
        return await commit(writes)

    store.commit = seen
    return written


async def marks_of(store, server) -> dict:
    return (await store.get(tally.marks_key(server.recounts.epoch))).record


async def test_an_ack_counted_later_is_one_plain_write_then_counted_by_its_mark_and_its_entry_let_go(server, store):
    pushed = (await push(server, job()))["id"]
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)
    written = commits_of(store)
    assert (await server.ops.ack(got["id"]))["state"] == "completed"
    assert written == [[pushed]], "the ack alone: no tally written with it"
    acked = (await store.get(pushed)).record
    assert acked["_counted"] == "available" and acked["_mark"] == [server.recounts.epoch, 1]  # its claim counted later too
    assert tally.place(acked)[:2] == ("q", "available"), "counted where it was until its mark is"
    assert counts(await server.queues.stats("q")) == (0, 0, 1)  # read here: waits for its mark's batch
    assert (await store.get(pushed)).record == acked, "the record not written again"
    assert written[1][0] == tally.marks_key(server.recounts.epoch) and pushed not in written[1]
    assert any(k.startswith("tally.q.") for k in written[1]), "its tally moved in the same batch"
    assert await marks_of(store, server) == tally.marks_record(server.recounts.epoch, 1, [])
    assert tally.place(acked, {server.recounts.epoch: await marks_of(store, server)})[:2] == ("q", "completed")
    assert await store.ready_counts("q") == (0, 0), "its entry let go once counted"


async def test_counts_read_through_a_server_wait_for_its_acks_on_their_way_before_counting_those_after(store, clock):
    server = await Engine(store, clock=clock, count_acks_later=True).start(clocks=False)  # its claims counted at once
    for _ in range(2):
        await push(server, job())
    first, second = await server.ops.fetch(["q"], 2, "w", 60_000)
    gate = gated(store)  # the first ack's write held on its way: its number comes before the second's
    acking = asyncio.ensure_future(server.ops.ack(first["id"]))
    await every_task_ran()
    await server.ops.ack(second["id"])
    reading = asyncio.ensure_future(server.queues.stats("q"))
    await every_task_ran()
    assert not reading.done(), "the first ack's outcome decides whether the marks can pass its number"
    gate.set()
    await acking
    assert counts(await reading) == (0, 0, 2), "the ack the worker was answered for counts as done"
    await server.stop()


async def test_an_ack_whose_server_died_before_counting_it_is_counted_by_the_fetch_that_meets_its_entry(
        server, servers, store, clock, monkeypatch):
    other = servers[0]  # counts at once
    pushed = (await push(server, job()))["id"]
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)
    monkeypatch.setattr(server.recounts, "_resolved", lambda *said: None)  # dies between write and count
    await server.ops.ack(got["id"])
    assert counts(await other.queues.stats("q")) == (1, 0, 0), "counted where it was, as its record says"
    assert await other.ops.fetch(["q"], 1, "w2", 60_000) == [], "its entry is held"
    clock.advance(TAKEN_HOLD + 1)
    assert await other.ops.fetch(["q"], 1, "w2", 60_000) == [], "met again: counted, not run again"
    assert counts(await other.queues.stats("q")) == (0, 0, 1)
    assert "_counted" not in (await store.get(pushed)).record
    assert (await marks_of(store, server))["skip"] == [1], "its number taken: its server would leave it out"
    assert await store.ready_counts("q") == (0, 0)


async def test_many_acks_of_a_server_that_died_met_by_one_fetch_are_counted_together_and_the_fetch_stands(
        server, servers, store, clock, monkeypatch):
    other = servers[0]
    for _ in range(20):
        await push(server, job())
    got = await server.ops.fetch(["q"], 20, "w", 60_000)
    monkeypatch.setattr(server.recounts, "_resolved", lambda *said: None)  # dies before counting any
    await asyncio.gather(*(server.ops.ack(j["id"]) for j in got))
    for _ in range(5):
        await push(other, job())
    commit, key, lost = store.commit, tally.marks_key(server.recounts.epoch), []

    async def told(writes):  # a take of the marks record that loses its compare-and-set, kept
        try:
            return await commit(writes)
        except Conflict:
            lost.extend(w.key for w in writes if w.key == key)
            raise

    store.commit = told
    clock.advance(TAKEN_HOLD + 1)
    fetched = await other.ops.fetch(["q"], 25, "w2", 60_000)  # meets the twenty entries and the five new jobs
    assert len(fetched) == 5 and not {j["id"] for j in fetched} & {j["id"] for j in got}
    assert counts(await other.queues.stats("q")) == (0, 5, 20)
    assert (await marks_of(store, server))["skip"] == list(range(1, 21))
    assert lost == [], "the takes of one process go in one write of its marks record a batch: none loses to another"
    assert await store.ready_counts("q") == (0, 5)


async def test_an_ack_counted_by_a_fetch_elsewhere_while_its_server_was_slow_is_counted_once(
        server, servers, store, clock):
    other = servers[0]
    pushed = (await push(server, job()))["id"]
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)
    gate, reached, commit = asyncio.Event(), asyncio.Event(), store.commit
    key = tally.marks_key(server.recounts.epoch)

    async def slow(writes):  # the server's batch of marks held on its way, once
        if writes[0].key == key and not reached.is_set():
            reached.set()
            await gate.wait()
        return await commit(writes)

    store.commit = slow
    await server.ops.ack(got["id"])
    await asyncio.wait_for(reached.wait(), 30)
    clock.advance(TAKEN_HOLD + 1)
    assert await other.ops.fetch(["q"], 1, "w2", 60_000) == []  # meets the entry: moves the count itself
    assert counts(await other.queues.stats("q")) == (0, 0, 1)
    gate.set()  # the slow batch loses its compare-and-set, reads the marks again and leaves the number out
    assert counts(await server.queues.stats("q")) == (0, 0, 1), "counted once"
    assert await marks_of(store, server) == tally.marks_record(server.recounts.epoch, 1, [1])
    assert await store.ready_counts("q") == (0, 0)
    assert tally.place((await store.get(pushed)).record, {server.recounts.epoch: await marks_of(store, server)})[:2] == (
        "q", "completed")


async def test_a_batch_of_marks_that_fails_is_logged_and_tried_again_and_not_after_its_server_stopped(
        server, store, monkeypatch):
    monkeypatch.setattr(recounts, "AGAIN", 0.01)
    pushed = (await push(server, job()))["id"]
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)
    commit, failed, key = store.commit, [], tally.marks_key(server.recounts.epoch)

    async def away(writes):  # NATS away for the marks' first two batches: not stored
        if writes[0].key == key and len(failed) < 2:
            failed.append(writes)
            raise ConnectionError("nats: connection closed")
        return await commit(writes)

    store.commit = away
    with capture_logs() as logs:
        await server.ops.ack(got["id"])
        async def counted():
            held = await store.get(key)
            return held is not None and held.record["upto"] == 1
        await wait_for(counted, what="the marks counted once NATS answers")
    assert len(failed) == 2 and [e["event"] for e in logs].count("job_recount_failed") == 2
    assert counts(await server.queues.stats("q")) == (0, 0, 1) and await store.ready_counts("q") == (0, 0)
    assert (await store.get(pushed)).record["_mark"] == [server.recounts.epoch, 1]


async def test_an_ack_whose_answer_never_came_is_read_back_and_counted_if_it_was_stored(server, store):
    pushed = (await push(server, job()))["id"]
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)
    commit = store.commit

    async def unanswered(writes):
        out = await commit(writes)
        if writes[0].key == pushed and writes[0].record.get("_mark"):
            raise TimeoutError("nats: timeout")
        return out

    store.commit = unanswered
    with pytest.raises(TimeoutError):
        await server.ops.ack(got["id"])
    assert counts(await server.queues.stats("q")) == (0, 0, 1), "read back: stored, so counted"
    assert await marks_of(store, server) == tally.marks_record(server.recounts.epoch, 1, [])


async def test_an_ack_whose_answer_never_came_and_that_lands_after_it_was_read_back_counts_where_it_was_until_met(
        server, servers, store, clock):
    pushed = (await push(server, job()))["id"]
    [got] = await servers[0].ops.fetch(["q"], 1, "w", 60_000)  # a claim counted at once: nothing writes it again
    commit, late = store.commit, []

    async def unanswered(writes):
        if writes[0].key == pushed and writes[0].record.get("_mark"):
            late.append(writes)
            raise TimeoutError("nats: timeout")
        return await commit(writes)

    store.commit = unanswered
    with pytest.raises(TimeoutError):
        await server.ops.ack(got["id"])
    assert counts(await server.queues.stats("q")) == (0, 1, 0), "read back: not there, its number skipped"
    assert (await marks_of(store, server))["skip"] == [1]
    [write] = late[0]
    await commit([write])  # the write lands late: its number already skipped
    assert (await store.get(pushed)).record["state"] == "completed"
    assert counts(await servers[0].queues.stats("q")) == (0, 1, 0), "counted where its write left it, as a scan says"
    clock.advance(TAKEN_HOLD + 1)
    assert await servers[0].ops.fetch(["q"], 1, "w2", 60_000) == [], "met again: counted, not run again"
    assert counts(await servers[0].queues.stats("q")) == (0, 0, 1)


async def test_a_claim_counted_later_is_counted_as_active_once_it_has_run_a_moment(server, servers, monkeypatch):
    other = servers[0]  # read there: nothing of its own to recount first
    monkeypatch.setattr(recounts, "COUNTED_AFTER", 0.0)
    await push(server, job())
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)
    async def running_elsewhere():
        return counts(await other.queues.stats("q")) == (0, 1, 0)
    await wait_for(running_elsewhere, what="the claim counted as active through another server")
    await server.ops.ack(got["id"])
    assert counts(await server.queues.stats("q")) == (0, 0, 1)


async def test_counts_read_through_the_server_that_claimed_show_the_claim_at_once(server):
    await push(server, job())
    await server.ops.fetch(["q"], 1, "w", 60_000)
    assert counts(await server.queues.stats("q")) == (0, 1, 0)


async def test_acks_of_one_turn_are_counted_together_and_one_taken_meanwhile_does_not_hold_the_others(
        server, servers, store):
    for _ in range(3):
        await push(server, job())
    got = await server.ops.fetch(["q"], 3, "w", 60_000)
    written = commits_of(store)
    gate, reached, commit, key = asyncio.Event(), asyncio.Event(), store.commit, tally.marks_key(server.recounts.epoch)

    async def held(writes):  # the turn's batch held on its way until the delete is stored
        if writes[0].key == key and not reached.is_set():
            reached.set()
            await gate.wait()
        return await commit(writes)

    store.commit = held
    await asyncio.gather(*(server.ops.ack(j["id"]) for j in got))  # acked in one turn
    await asyncio.wait_for(reached.wait(), 30)
    await servers[0].delete(got[0]["id"])  # its count moved by the delete, its number taken
    gate.set()
    assert counts(await server.queues.stats("q")) == (0, 0, 2)
    marked = [keys for keys in written if key in keys]
    assert got[0]["id"] in marked[0] and len(marked) >= 3, "the delete's, the turn's batch (lost), and again"
    assert all(len(keys) == 2 for keys in marked[1:]), "the turn's acks in one batch: the marks and one tally"
    assert await marks_of(store, server) == tally.marks_record(server.recounts.epoch, 3, [1])
    assert await store.ready_counts("q") == (0, 0)
    assert [(await store.get(j["id"])).record["_mark"][1] for j in got[1:]] == [2, 3], "not written again"


def waiting(stats: dict) -> tuple[int, int, int]:
    return stats["scheduled"], stats["available"], stats["completed"]


async def test_a_job_come_due_is_one_plain_write_shown_available_at_once_here_and_a_moment_later_elsewhere(
        server, servers, store, clock, monkeypatch):
    monkeypatch.setattr(recounts, "COUNTED_AFTER", 0.0)
    due = (clock() + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    first, second = [(await push(server, job(scheduled_at=due)))["id"] for _ in range(2)]
    written = commits_of(store)
    clock.advance(5)
    assert await server.tick() == 2
    assert written[:2] == [[first], [second]], "each made available alone: no tally written with it"
    assert (await store.get(first)).record["_counted"] == "scheduled"
    async def shown_elsewhere():  # counted where it was, then recounted by its server's timer
        return waiting(await servers[0].queues.stats("q")) == (0, 2, 0)
    await wait_for(shown_elsewhere, what="both counted as available through another server")
    assert "_counted" not in (await store.get(first)).record


async def test_a_job_come_due_is_shown_available_at_once_through_its_server_and_claimed_with_no_recount_between(
        server, store, clock):
    due = (clock() + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    pushed = (await push(server, job(scheduled_at=due)))["id"]
    clock.advance(5)
    await server.tick()
    [got] = await server.ops.fetch(["q"], 1, "w", 60_000)  # before its recount: the claim carries its count on
    assert (await store.get(pushed)).record["_counted"] == "scheduled"
    assert waiting(await server.queues.stats("q")) == (0, 0, 0) and counts(await server.queues.stats("q")) == (0, 1, 0)
    await server.ops.ack(got["id"])
    assert waiting(await server.queues.stats("q")) == (0, 0, 1)


async def test_a_job_come_due_whose_server_died_before_its_recount_is_counted_as_scheduled_until_its_next_change(
        server, servers, store, clock, monkeypatch):
    other = servers[0]  # counts at once
    due = (clock() + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    pushed = (await push(server, job(scheduled_at=due)))["id"]
    monkeypatch.setattr(server.recounts, "_recount_later", lambda *said: None)  # dies between write and recount
    clock.advance(5)
    await server.tick()
    assert waiting(await other.queues.stats("q")) == (1, 0, 0), "counted where it was, as its record says"
    [got] = await other.ops.fetch(["q"], 1, "w", 60_000)
    assert got["id"] == pushed and got["state"] == "active"
    assert counts(await other.queues.stats("q")) == (0, 1, 0) and (await other.queues.stats("q"))["scheduled"] == 0
    await other.ops.ack(pushed)
    assert waiting(await other.queues.stats("q")) == (0, 0, 1)


async def test_a_fetch_that_meets_a_job_come_due_before_its_plain_write_is_stored_waits_for_it(server, store, clock):
    due = (clock() + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    pushed = (await push(server, job(scheduled_at=due)))["id"]
    held, gate, asked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    commit, landed = store.commit, server.store.landed

    async def slow(writes):
        if any(w.key == pushed for w in writes):
            held.set()
            await gate.wait()
        return await commit(writes)

    async def landing(key):
        asked.set()
        await landed(key)

    store.commit, server.store.landed = slow, landing
    clock.advance(5)
    ticking = asyncio.ensure_future(server.tick())
    await held.wait()  # its entry offered, its record on its way
    fetching = asyncio.ensure_future(server.ops.fetch(["q"], 1, "w", 60_000))
    await asyncio.wait_for(asked.wait(), 30)  # the fetch met the entry and asks after its record
    gate.set()
    assert [j["id"] for j in await fetching] == [pushed], "not held back as an entry early for its record"
    await ticking
