"""The engine (seamq.jobs.engine) on the in-memory store and a clock the test moves: every transition
and timer rule, and what must hold across servers (two engines on one store), in well under a second."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from seamq.jobs import beats
from seamq.jobs.engine import Engine
from seamq.jobs.memory_store import Clock
from seamq.jobs.model import OjsError
from seamq.jobs.ports import TAKEN_HOLD

from helpers.engines import job, push


async def test_fetch_takes_by_priority_then_in_order_and_each_job_once_across_two_servers(servers):
    one, other = servers
    ids = [(await push(one, job(priority=p)))["id"] for p in (0, 5, 0, 5)]
    got = await one.ops.fetch(["q"], 2, "w1") + await other.ops.fetch(["q"], 5, "w2")
    assert [j["id"] for j in got] == [ids[1], ids[3], ids[0], ids[2]]
    assert [j["attempt"] for j in got] == [1, 1, 1, 1] and await one.ops.fetch(["q"], 5, "w3") == []
    with pytest.raises(OjsError) as duplicate:
        await one.ops.push({**job(), "id": ids[0]})
    assert duplicate.value.status == 409 and duplicate.value.code == "duplicate"


async def test_an_ack_ends_the_job_and_its_entry_never_comes_again(engine, clock):
    pushed = await push(engine, job())
    [got] = await engine.ops.fetch(["q"], 1, "w", 1000)
    done = await engine.ops.ack(got["id"], {"ok": True})
    assert done["state"] == "completed" and done["result"] == {"ok": True}
    clock.advance(5)
    assert await engine.ops.fetch(["q"], 1, "w") == []
    with pytest.raises(OjsError) as again:
        await engine.ops.ack(pushed["id"])
    assert again.value.status == 409
    stats = await engine.queues.stats("q")
    assert (stats["available"], stats["active"], stats["completed"]) == (0, 0, 1)


async def test_a_failure_retries_after_its_backoff_then_is_dead_lettered(engine, clock):
    retry = {"max_attempts": 2, "initial_interval": "PT10S", "jitter": False, "on_exhaustion": "dead_letter"}
    pushed = await push(engine, job(retry=retry))
    [got] = await engine.ops.fetch(["q"], 1, "w")
    failed = await engine.ops.nack(got["id"], {"type": "Timeout", "message": "slow"})
    assert failed["state"] == "retryable" and failed["retry_delay_ms"] == 10_000
    assert (await engine.queues.stats("q"))["retryable"] == 1
    clock.advance(9)
    assert await engine.tick() == 0 and await engine.ops.fetch(["q"], 1, "w") == []
    clock.advance(1)
    assert await engine.tick() == 1
    [again] = await engine.ops.fetch(["q"], 1, "w")
    assert again["attempt"] == 2
    last = await engine.ops.nack(again["id"], {"type": "Timeout", "message": "slower"})
    assert last["state"] == "discarded" and [e["attempt"] for e in last["errors"]] == [1, 2]
    assert [d["id"] for d in await engine.dead_letters(None)] == [pushed["id"]]
    assert (await engine.retry_dead_letter(pushed["id"]))["state"] == "available"
    assert await engine.dead_letters(None) == []


async def test_a_lease_that_runs_out_comes_back_to_another_worker_with_the_attempt_in_the_history(servers, clock):
    one, other = servers
    await push(one, job())
    [got] = await one.ops.fetch(["q"], 1, "w-gone", 1000)
    clock.advance(0.5)
    assert await other.ops.fetch(["q"], 1, "w2", 1000) == []
    clock.advance(1)
    [again] = await other.ops.fetch(["q"], 1, "w2", 1000)
    assert again["id"] == got["id"] and again["attempt"] == 2 and again["worker_id"] == "w2"
    assert [(e["code"], e["attempt"]) for e in again["errors"]] == [("lease_expired", 1)]
    assert (await one.ops.ack(again["id"]))["state"] == "completed"  # acked at a server whose copy was stale


async def test_a_lease_longer_than_the_entrys_hold_is_kept_when_the_entry_comes_again(servers, store, clock):
    """A claim holds no entry for a lease longer than TAKEN_HOLD (most jobs end first): when the entry
    comes again the job is not handed out twice, and its entry is held for what remains of the lease."""
    one, other = servers
    await push(one, job())
    [got] = await one.ops.fetch(["q"], 1, "w-long", 120_000)
    clock.advance(TAKEN_HOLD + 1)
    assert await other.ops.fetch(["q"], 1, "w2") == []  # the entry came again, and was held
    clock.advance(120 - TAKEN_HOLD - 2)
    assert await other.ops.fetch(["q"], 1, "w2") == [] and (await one.ops.info(got["id"]))["state"] == "active"
    clock.advance(2)
    [again] = await other.ops.fetch(["q"], 1, "w2")
    assert (again["id"], again["attempt"], again["errors"][0]["code"]) == (got["id"], 2, "lease_expired")


async def test_heartbeats_keep_the_lease_and_name_a_cancelled_job(engine, clock):
    first, second = [(await push(engine, job()))["id"] for _ in range(2)]
    await engine.ops.fetch(["q"], 2, "w", 1000)
    for _ in range(5):
        clock.advance(0.8)
        answer = await beats.heartbeat(engine.ops, "w", [first, second], 1000)
        assert answer["jobs_extended"] == [first, second]
    assert await engine.ops.fetch(["q"], 2, "thief", 1000) == []
    await engine.ops.cancel(second)
    answer = await beats.heartbeat(engine.ops, "w", [first, second], 1000)
    assert (answer["jobs_extended"], answer["jobs_cancelled"], answer["state"]) == ([first], [second], "running")
    assert (await beats.heartbeat(engine.ops, "w", [second]))["state"] == "terminate"  # every job it named was cancelled
    clock.advance(10)  # the first's lease (no more heartbeats) ran out; the cancelled one's entry is gone
    [back] = await engine.ops.fetch(["q"], 2, "w2")
    assert back["id"] == first


async def test_scheduled_jobs_wait_for_their_time_and_expired_ones_never_run(engine, clock):
    later = (clock() + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    scheduled = await push(engine, job(scheduled_at=later))
    gone = await push(engine, job(queue="e", expires_at="+PT30S"))
    assert scheduled["state"] == "scheduled" and await engine.ops.fetch(["q"], 1, "w") == []
    assert (await engine.queues.stats("q"))["scheduled"] == 1
    clock.advance(31)
    await engine.tick()
    assert (await engine.ops.info(gone["id"]))["state"] == "discarded" and await engine.ops.fetch(["e"], 1, "w") == []
    clock.advance(30)
    await engine.tick()
    [now] = await engine.ops.fetch(["q"], 1, "w")
    assert now["id"] == scheduled["id"] and (await engine.queues.stats("q"))["scheduled"] == 0


async def test_a_job_over_its_timeout_fails_once_even_if_the_timer_comes_twice(engine, store, clock):
    await push(engine, job(timeout_ms=2000, retry={"max_attempts": 1}))
    [got] = await engine.ops.fetch(["q"], 1, "w")
    clock.advance(2)
    [timer] = await store.fired(10, 0)
    await engine.ops.fire(timer)
    await engine.ops.fire(timer)  # handed out twice (a server died before it said done)
    failed = await engine.ops.info(got["id"])
    assert failed["state"] == "discarded" and [e["code"] for e in failed["errors"]] == ["timeout"]


async def test_a_requeue_releases_the_job_at_once_without_using_up_attempts(engine):
    await push(engine, job(retry={"max_attempts": 1}))
    [got] = await engine.ops.fetch(["q"], 1, "w")
    released = await engine.ops.nack(got["id"], {"code": "worker_stopped", "message": "stopping"}, requeue=True)
    assert released["state"] == "available"
    [again] = await engine.ops.fetch(["q"], 1, "w2")
    assert again["attempt"] == 2 and (await engine.ops.ack(again["id"]))["state"] == "completed"


async def test_an_ack_to_a_server_whose_copy_is_stale_is_refused_if_the_job_moved_on(servers):
    one, other = servers
    pushed = await push(one, job())
    await one.ops.fetch(["q"], 1, "w")  # this server keeps its copy of the running job
    await other.ops.cancel(pushed["id"])  # another server cancels it
    with pytest.raises(OjsError) as refused:
        await one.ops.ack(pushed["id"])
    assert refused.value.status == 409 and "cancelled" in refused.value.message


async def test_a_pause_made_through_one_server_holds_on_the_other(servers):
    one, other = servers
    await push(one, job())
    await one.set_paused("q", True)
    await asyncio.sleep(0)  # the change reaches the other server's followed flags
    assert other.queues.paused("q") and await other.ops.fetch(["q"], 1, "w") == []
    await other.set_paused("q", False)
    await asyncio.sleep(0)
    assert len(await one.ops.fetch(["q"], 1, "w")) == 1


async def test_a_resume_made_through_one_server_holds_on_the_other_before_its_change_comes(servers):
    one, other = servers
    await push(one, job())
    await one.set_paused("q", True)
    await asyncio.sleep(0)
    await other.set_paused("q", False)
    assert one.queues.paused("q"), "not heard yet"
    assert len(await one.ops.fetch(["q"], 1, "w")) == 1  # the pause known there was read again


async def test_a_rate_limit_holds_across_servers(servers, clock):
    one, other = servers
    for _ in range(3):
        await push(one, job(queue="rl", rate_limit={"max_per_second": 1}))
    await asyncio.sleep(0)
    assert len(await one.ops.fetch(["rl"], 3, "w")) == 1 and await other.ops.fetch(["rl"], 3, "w") == []
    clock.advance(1)
    assert len(await other.ops.fetch(["rl"], 3, "w")) == 1


async def test_unique_jobs_hold_across_servers(servers):
    one, other = servers
    body = job(unique={"keys": ["type", "args"], "on_conflict": "reject"})
    first = await push(one, body)
    with pytest.raises(OjsError) as refused:
        await other.ops.push(body)
    assert refused.value.details["existing_job_id"] == first["id"]


async def test_a_chain_runs_its_steps_in_order_and_passes_results_on(servers):
    one, other = servers
    created = await one.flows.create({"type": "chain", "name": "c", "steps": [
        {"type": "s.one", "args": [], "options": {"queue": "wf"}},
        {"type": "s.two", "args": [], "options": {"queue": "wf"}}]})
    [first] = await one.ops.fetch(["wf"], 5, "w")
    await other.ops.ack(first["id"], {"n": 1})
    [second] = await other.ops.fetch(["wf"], 5, "w")
    assert second["type"] == "s.two" and second["parent_results"] == [{"n": 1}]
    await one.ops.ack(second["id"])
    assert (await other.flows.get(created["id"]))["state"] == "completed"


async def test_a_group_whose_jobs_end_on_two_servers_at_once_completes_once(servers):
    one, other = servers
    created = await one.flows.create({"type": "batch", "name": "g", "jobs": [
        {"type": "g.a", "args": [], "options": {"queue": "g"}}, {"type": "g.b", "args": [], "options": {"queue": "g"}}],
        "callbacks": {"on_complete": {"type": "g.done", "args": [], "options": {"queue": "g"}}}})
    a, b = await one.ops.fetch(["g"], 2, "w")
    await asyncio.gather(one.ops.ack(a["id"]), other.ops.ack(b["id"]))
    [callback] = await one.ops.fetch(["g"], 5, "w")
    assert callback["type"] == "g.done" and await one.ops.fetch(["g"], 5, "w") == []
    assert (await one.flows.get(created["id"]))["state"] == "completed"


async def test_a_cron_tick_fired_twice_enqueues_one_job(servers, store, clock):
    one, other = servers
    await one.crontab.register({"name": "every", "expression": "* * * * *", "job_template": job(queue="cr")})
    clock.advance(61)
    [timer] = await store.fired(10, 0)
    await one.crontab.fire(timer.key, timer.token["attempt"])
    await other.crontab.fire(timer.key, timer.token["attempt"])
    assert len(await one.ops.fetch(["cr"], 5, "w")) == 1
    assert [c["name"] for c in await other.crontab.listing()] == ["every"]


async def test_a_cron_registered_or_deleted_through_one_server_is_listed_so_by_another_at_once(servers):
    """Behind a load balancer, a list right after a delete goes to any server (conformance L2-CRON-003)."""
    one, other = servers
    await one.crontab.register({"name": "nightly", "expression": "0 0 * * *", "job_template": job(queue="cr")})
    assert [c["name"] for c in await other.crontab.listing()] == ["nightly"]
    await one.crontab.delete("nightly")
    assert await other.crontab.listing() == []


async def test_a_job_whose_lease_ran_out_is_back_in_its_queue_when_read(servers, clock):
    one, other = servers
    pushed = await push(one, job())
    await one.ops.fetch(["q"], 1, "w-gone", 1000)
    clock.advance(2)
    seen = await other.ops.info(pushed["id"])
    assert seen["state"] == "available" and [e["code"] for e in seen["errors"]] == ["lease_expired"]
    [again] = await one.ops.fetch(["q"], 5, "w2")
    assert again["attempt"] == 2 and await other.ops.fetch(["q"], 5, "w3") == []


async def test_a_fetch_whose_read_lags_the_last_writes_claims_each_job_and_drops_no_entry(servers, store, clock):
    """A fetch reads its jobs in one batch that any replica may answer (NATS direct gets), so it may
    see a job as it was before its last change: not yet there, waiting for its retry, or available
    at an older revision. Decided on that read, entries were dropped and their jobs never ran (the R3
    kill test, 2026-11-25: 13 of 5,000); each is decided again on the record as last stored."""
    one, other = servers
    retry = {"max_attempts": 3, "initial_interval": "PT1S", "jitter": False}
    store.lag()  # a replica that has seen none of what follows
    fresh = await push(one, job(retry=retry))
    [got] = await other.ops.fetch(["q"], 5, "w1", 1000)  # read as absent, claimed from the stored record
    assert got["id"] == fresh["id"] and got["attempt"] == 1
    store.lag()  # it has seen the claim, not the failure, the retry or the release
    assert (await other.ops.nack(got["id"], {"type": "Flaky", "message": "once"}))["state"] == "retryable"
    clock.advance(1)
    await one.tick()
    [again] = await one.ops.fetch(["q"], 5, "w2", 1000)  # read as active under its first lease: claimed
    assert again["attempt"] == 2
    clock.advance(2)  # the lease runs out: released when it comes again, read as active at attempt 2
    store.lag()
    assert (await one.ops.info(again["id"]))["state"] == "available"  # released on this read
    [third] = await other.ops.fetch(["q"], 5, "w3", 1000)
    assert third["attempt"] == 3 and (await one.ops.ack(third["id"]))["state"] == "completed"
    for _ in range(14):
        clock.advance(5)
        assert await other.ops.fetch(["q"], 5, "w4") == []
    store.catch_up()
    assert await store.ready_counts("q") == (0, 0)


async def test_a_takes_claims_go_together_and_one_read_before_its_job_moved_on_is_decided_again(servers, store):
    """A take's jobs read as available are claimed together (a CAS each, no task each). One that moved on
    after the batched read loses its CAS alone and is decided again on its record as last stored: claimed
    if it is available again (run and released meanwhile), its entry dropped if it was cancelled. A job
    under a rate limit key takes its own path; the rest are handed out."""
    one, other = servers
    jobs = [await push(one, job()) for _ in range(4)]
    limited = await push(one, job(rate_limit={"key": "k", "concurrency": 5}))
    store.lag()  # the batched reads see all five available, as first stored
    [ran] = await other.ops.fetch(["q"], 1, "w0", 60_000)
    await other.ops.nack(ran["id"], {"message": "stopping"}, requeue=True)  # available again, a revision on
    await other.ops.cancel(jobs[1]["id"])
    got = {j["id"]: j for j in await one.ops.fetch(["q"], 10, "w", 60_000)}
    expected = [jobs[0]["id"], jobs[2]["id"], jobs[3]["id"], limited["id"]]
    assert ran["id"] == jobs[0]["id"] and sorted(got) == sorted(expected)
    assert [(got[job_id]["state"], got[job_id]["attempt"]) for job_id in expected] == [("active", 2), *[("active", 1)] * 3]
    store.catch_up()
    assert (await one.ops.info(jobs[1]["id"]))["state"] == "cancelled"
    assert [(await one.ops.ack(job_id))["state"] for job_id in expected] == ["completed"] * 4
    assert await other.ops.fetch(["q"], 10, "w2") == [] and await store.ready_counts("q") == (0, 0)


async def test_a_fetch_slower_than_its_lease_hands_each_job_out_once(store, clock):
    """On a starved server a fetch may outlast the leases it gives: its own claim runs out before it
    answers, the entry comes again within the same fetch, and the job is claimed anew. The worker gets
    it once, as last claimed (seen on a 2-core machine running three R3 kill tests at once)."""

    class Starved(Clock):  # every read of the time finds it 1.1 s later: past a lease of 1 s, and its hold
        def __call__(self):
            self.advance(1.1)
            return self.now

    slow = Starved(clock())
    store.clock = slow
    engine = await Engine(store, clock=slow).start(clocks=False)
    try:
        await push(engine, job())
        got = await engine.ops.fetch(["q"], 5, "w", 1000)
        assert len(got) == 1 and got[0]["attempt"] > 1  # claimed again within the fetch, handed out once
        assert [e["code"] for e in got[0]["errors"]] == ["lease_expired"] * (got[0]["attempt"] - 1)
        assert (await engine.ops.info(got[0]["id"]))["attempt"] == got[0]["attempt"]  # as last claimed
    finally:
        await engine.stop()


async def test_an_ack_that_loses_its_compare_and_set_to_the_workers_heartbeat_is_tried_again(servers, store):
    """A worker's heartbeat and its ack may reach two servers at once: the ack that loses its
    compare-and-set to the heartbeat is read again and stored, not refused with a 409 (which a
    worker takes as "already acked", so the job would run again when its lease ran out)."""
    one, other = servers
    await push(one, job())
    [got] = await one.ops.fetch(["q"], 1, "w", 60_000)
    one.ops.handed_out.clear()  # the ack reaches a server that holds no copy of the job
    read, heard = store.get, []

    async def read_then_beat(key: str):
        held = await read(key)
        if key == got["id"] and len(heard) < 2 and not heard.count("now"):  # lands between read and CAS
            heard.append("now")
            answer = await beats.heartbeat(other.ops, "w", [key], 60_000)
            heard[-1] = answer["jobs_extended"]
        return held

    store.get = read_then_beat
    assert (await one.ops.ack(got["id"]))["state"] == "completed"
    assert heard == [[got["id"]], [got["id"]]]  # two heartbeats won a compare-and-set over the ack


async def test_events_of_both_servers_are_listed_by_either_and_a_cursor_reads_on_at_the_other(servers):
    one, other = servers
    first = await push(one, job())
    second = await push(other, job())
    [taken] = await one.ops.fetch(["q"], 1, "w")
    await one.events.flush()  # what a server does every tenth of a second (the other writes its own as it lists)
    listed = await other.events.list([], [], 10)
    assert [(e["type"], e["subject"]) for e in listed["events"]] == [  # in the order their batches were written
        ("job.enqueued", first["id"]), ("job.started", taken["id"]), ("job.enqueued", second["id"])]
    assert len({e["id"] for e in listed["events"]}) == 3 and not listed["has_more"]
    await other.ops.ack(taken["id"])
    page = await one.events.list([], [], 2)  # then on from its cursor, through the other server
    rest = await other.events.list([], [], 10, int(page["cursor"]))
    assert page["has_more"] and [e["type"] for e in page["events"] + rest["events"]] == [
        "job.enqueued", "job.started", "job.enqueued", "job.completed"]
    assert (await one.events.list(["job.completed"], ["q"], 10))["events"][0]["data"]["job_id"] == taken["id"]


async def test_each_change_is_told_once_as_stored_whichever_path_made_it(engine, store, clock):
    """The event a change is told as is named by the change (seamq.jobs.job.aftermath) and told where
    it is stored: an ack, a nack, a timeout, an expiry met in a fetch or by its timer, a cancel."""
    done, failed, timed, fetched_late, fired_late, cancelled = [await push(engine, job(**options)) for options in (
        {}, {"retry": {"max_attempts": 1}}, {"timeout_ms": 1000}, {"queue": "x", "expires_at": "+PT10S"},
        {"queue": "y", "expires_at": "+PT10S"}, {"queue": "z"})]
    got = {j["id"]: j for j in await engine.ops.fetch(["q"], 3, "w")}
    assert got.keys() == {done["id"], failed["id"], timed["id"]}
    await engine.ops.ack(done["id"], {"ok": 1})
    await engine.ops.nack(failed["id"], {"type": "Boom", "message": "no"})
    await engine.ops.cancel(cancelled["id"])
    clock.advance(11)
    assert await engine.ops.fetch(["x"], 1, "w") == []  # met in its entry past its time
    for timer in await store.fired(10, 0):  # the timeout's, the other expiry's
        await engine.ops.fire(timer)
    await engine.events.flush()
    told = {}
    for event in (await engine.events.list([], [], 100))["events"]:
        told.setdefault(event["subject"], []).append(event["type"])
    assert told == {done["id"]: ["job.enqueued", "job.started", "job.completed"],
                    failed["id"]: ["job.enqueued", "job.started", "job.discarded"],
                    timed["id"]: ["job.enqueued", "job.started", "job.retrying"],
                    fetched_late["id"]: ["job.enqueued", "job.expired"],
                    fired_late["id"]: ["job.enqueued", "job.expired"],
                    cancelled["id"]: ["job.enqueued", "job.cancelled"]}
    [completed] = (await engine.events.list(["job.completed"], [], 10))["events"]
    assert completed["data"]["result"] == {"ok": 1} and completed["data"]["duration_ms"] == 0


async def test_a_workflows_cancel_lets_each_job_go_as_any_cancel_does(engine, store, clock):
    later = (clock() + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    created = await engine.flows.create({"type": "batch", "name": "b", "jobs": [
        {"type": "b.now", "args": [], "options": {"queue": "b"}},
        {"type": "b.later", "args": [], "options": {"queue": "b", "scheduled_at": later}}]})
    assert len(store.timers) == 1
    await engine.flows.cancel(created["id"])
    assert store.timers == {} and await engine.ops.fetch(["b"], 5, "w") == []  # disarmed, withdrawn
    stats = await engine.queues.stats("b")
    assert (stats["available"], stats["scheduled"], stats["cancelled"]) == (0, 0, 2)


async def test_a_relayed_job_meeting_a_full_queue_waits_for_room_and_is_never_discarded(engine):
    """A job relayed from an outbox was committed with its producer's transaction: a bound refuses it
    for now (taken in again later), never keeps it as discarded."""
    import json

    from seamq.jobs import backpressure, intake

    await engine.queues.configure("q", backpressure.Bound(1))
    await push(engine, job())
    relayed = {**job(), "id": "01a247e2-8140-72fb-b1c4-4d524a34687a"}
    with pytest.raises(OjsError) as full:
        await intake.take_in(engine, json.dumps(relayed).encode())
    assert full.value.status == 429 and not await engine.ops.exists(relayed["id"])
    await engine.ops.fetch(["q"], 1, "w1")  # the queue has room again
    assert await intake.take_in(engine, json.dumps(relayed).encode()) == "created"
    assert (await engine.ops.info(relayed["id"]))["state"] == "available"


async def test_a_queue_is_listed_while_it_counts_a_job_though_none_of_its_jobs_was_ever_offered(engine, clock):
    pushed = await push(engine, job(queue="later", scheduled_at="2099-01-01T00:00:00Z"))
    assert "later" in await engine.queues.names()
    await engine.ops.cancel(pushed["id"])  # never available, so never offered: counted as cancelled alone
    assert "later" in await engine.queues.names()
    clock.advance(8 * 24 * 3600)  # its count's hour is past the retention period
    assert "later" not in await engine.queues.names()
