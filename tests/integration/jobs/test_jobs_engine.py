"""The OJS engine against a real nats-server: exclusive claims, records in KV, timers that survive."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from structlog.testing import capture_logs

from seamq.jobs.admission import BACKSTOP
from seamq.jobs.engine import Engine
from seamq.jobs.memory_store import MemoryJobStore
from seamq.jobs.model import OjsError
from seamq.jobs.nats_store import NatsJobStore


@pytest.fixture
async def engine(nc):
    store = await NatsJobStore(nc).start()
    engine = await Engine(store, test_mode=True).start()
    yield engine
    await engine.stop()


async def test_fifty_concurrent_fetches_claim_one_job_exactly_once(engine):
    _, job = await engine.ops.push({"type": "a.b", "args": [], "options": {"queue": "one"}})
    results = await asyncio.gather(*(engine.ops.fetch(["one"], worker_id=f"w{i}") for i in range(50)))
    winners = [r for r in results if r]
    assert len(winners) == 1 and winners[0][0]["id"] == job["id"] and winners[0][0]["attempt"] == 1
    assert sum(len(r) == 0 for r in results) == 49


async def test_two_engines_on_one_store_claim_a_job_once(nc, engine):
    """Two servers fetching the same queue at once: one gets the job, the other answers nothing."""
    _, job = await engine.ops.push({"type": "a.b", "args": [], "options": {"queue": "shared"}})
    other = await Engine(await NatsJobStore(nc).start()).start()
    try:
        first, second = await asyncio.gather(engine.ops.fetch(["shared"]), other.ops.fetch(["shared"]))
    finally:
        await other.stop()
    assert sorted([len(first), len(second)]) == [0, 1]
    assert (first or second)[0]["id"] == job["id"]


@pytest.mark.parametrize("fires_timers", [True, False])
async def test_the_stores_copy_of_a_timer_its_engine_holds_is_due_a_backstop_later(fires_timers):
    """A timer due soon is held by the engine that armed it, which fires it on time; the store's copy is
    due BACKSTOP later (two copies due at once both read the job, and one lost its write). An engine
    that fires no timers itself holds none, and the store's copy is due on time."""
    store = MemoryJobStore()
    engine = await Engine(store).start(clocks=fires_timers)
    try:
        due = datetime.now(timezone.utc) + timedelta(seconds=30)  # within SOON
        due = due.replace(microsecond=due.microsecond // 1000 * 1000)  # as a record's times are kept: to the ms
        await engine.ops.push({"type": "a.b", "args": [], "options": {"queue": "soon", "scheduled_at": due.isoformat()}})
        [at] = [at for (kind, _), (at, _) in store.timers.items() if kind == "scheduled"]
        assert at == due + (BACKSTOP if fires_timers else timedelta(0))
    finally:
        await engine.stop()


async def test_an_engine_with_its_clocks_on_the_memory_store_takes_in_relayed_jobs():
    """The memory store keeps the intake's promises too: a relayed job is created, and nothing is logged
    as failed (its engine's loops asked for an intake the store did not have, once a second)."""
    store = MemoryJobStore()
    with capture_logs() as logs:
        engine = await Engine(store).start()
        try:
            store.relay(b'{"id": "019a0000-0000-7000-8000-000000000001", "type": "a.b", "args": []}')
            deadline = asyncio.get_running_loop().time() + 30
            while not await engine.ops.exists("019a0000-0000-7000-8000-000000000001"):  # a liveness bound only
                assert asyncio.get_running_loop().time() < deadline, "the relayed job was never taken in"
                await asyncio.sleep(0.02)
        finally:
            await engine.stop()
    assert not store.relayed and not store.taken
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []


async def test_a_timer_the_engine_holds_whose_firing_fails_is_fired_again_on_its_clock():
    """The engine's copy of a timer due soon is tried again at once when its firing fails (a store
    request timed out), not left to the store's copy a second later or more; its first failure is
    logged, not each of its tries. The store's clock here stays at its start, so its copy never comes:
    only the engine's can move the job. Its reads of the job fail three times, the first once the push
    has returned, however long that takes (the timer may come before the record is stored)."""
    store = MemoryJobStore()
    engine = await Engine(store).start()
    job_id, get, failures, pushed = "019a0000-0000-7000-8000-0000000000aa", store.get, iter(range(3)), asyncio.Event()

    async def failing(key):
        if key == job_id and next(failures, None) is not None:
            await pushed.wait()
            raise ConnectionError("nats: timeout")
        return await get(key)
    store.get = failing
    try:
        with capture_logs() as logs:
            due = datetime.now(timezone.utc) + timedelta(seconds=0.3)
            await engine.ops.push({"id": job_id, "type": "a.b", "args": [],
                                   "options": {"queue": "soon", "scheduled_at": due.isoformat()}})
            pushed.set()
            deadline = asyncio.get_running_loop().time() + 30
            while store.records[job_id].record["state"] != "available":  # a liveness bound only
                assert asyncio.get_running_loop().time() < deadline, "the engine's copy was not fired again"
                await asyncio.sleep(0.02)
    finally:
        await engine.stop()
    assert next(failures, None) is None  # all three failed reads happened
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["ojs_timer_failed"]


async def test_the_stores_copy_of_a_timer_fires_it_when_the_engine_that_held_it_is_gone(nc):
    """The backstop: a job whose engine stopped before its time still comes due, from the store."""
    first = await Engine(await NatsJobStore(nc).start()).start()
    due = datetime.now(timezone.utc) + timedelta(seconds=3)
    _, orphan = await first.ops.push({"type": "a.b", "args": [], "options": {"queue": "gone", "scheduled_at": due.isoformat()}})
    await first.stop()
    second = await Engine(await NatsJobStore(nc).start()).start()
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while (await second.ops.info(orphan["id"]))["state"] != "available":  # a liveness bound only
            assert asyncio.get_running_loop().time() < deadline, "the store's copy never fired"
            await asyncio.sleep(0.05)
    finally:
        await second.stop()


async def test_wrong_transitions_are_conflicts_and_unknown_ids_not_found(engine):
    _, job = await engine.ops.push({"type": "a.b", "args": []})
    with pytest.raises(OjsError) as refused:
        await engine.ops.ack(job["id"])
    assert refused.value.status == 409
    with pytest.raises(OjsError) as missing:
        await engine.ops.info("01961111-aaaa-7bbb-8ccc-dddddddddddd")
    assert missing.value.status == 404


async def test_a_lease_that_runs_out_is_a_failed_attempt_in_the_history(engine):
    """No ack, nack or heartbeat within the visibility timeout: the job goes back to its queue, and the
    attempt that ended without a verdict is kept in its errors (every failed attempt is visible)."""
    _, job = await engine.ops.push({"type": "a.b", "args": [], "options": {"queue": "lease"}})
    [held] = await engine.ops.fetch(["lease"], worker_id="w-gone", visibility=200)
    for _ in range(200):
        if (await engine.ops.info(job["id"]))["state"] == "available":
            break
        await asyncio.sleep(0.05)
    back = await engine.ops.info(job["id"])
    assert back["state"] == "available" and held["attempt"] == 1
    assert [(e["code"], e["type"], e["attempt"]) for e in back["errors"]] == [("lease_expired", "LeaseExpired", 1)]
    assert "w-gone" in back["errors"][0]["message"]
    [again] = await engine.ops.fetch(["lease"], worker_id="w-2")
    assert again["attempt"] == 2
    assert (await engine.ops.ack(again["id"]))["state"] == "completed"


async def test_a_flag_changed_after_nats_restarted_reaches_every_server(nats_server):
    """Each server follows the flags through KV watches; nats-server restarting cuts them. A pause
    set afterwards through one server must reach the other (a watch that died quietly would leave
    it fetching from a paused queue for good)."""
    import nats

    clients = [await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
               for _ in range(2)]
    one, two = [await Engine(await NatsJobStore(nc).start()).start(clocks=False) for nc in clients]
    try:
        nats_server.kill()
        nats_server.start()
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # the write waits for NATS to be back with its stream
            try:
                await one.set_paused("q", True)
                break
            except Exception:
                assert asyncio.get_running_loop().time() < deadline, "NATS never came back"
                await asyncio.sleep(0.2)
        while not two.queues.paused("q"):
            assert asyncio.get_running_loop().time() < deadline, "the pause never reached the other server"
            await asyncio.sleep(0.1)
    finally:
        for engine in (one, two):
            await engine.stop()
        for nc in clients:
            await nc.close()


async def test_events_written_by_one_server_are_listed_by_another(nc, engine):
    other = await Engine(await NatsJobStore(nc).start()).start()
    try:
        _, job = await engine.ops.push({"type": "a.b", "args": [], "options": {"queue": "ev"}})
        deadline = asyncio.get_running_loop().time() + 10
        while not (listed := await other.events.list([], ["ev"], 10))["events"]:  # within a tenth of a second
            assert asyncio.get_running_loop().time() < deadline, "the other server never listed the event"
            await asyncio.sleep(0.05)
        assert [(e["type"], e["subject"]) for e in listed["events"]] == [("job.enqueued", job["id"])]
        await other.ops.cancel(job["id"])
        after = await engine.events.list([], ["ev"], 10, int(listed["cursor"]))
        while not after["events"]:
            assert asyncio.get_running_loop().time() < deadline, "the cursor read nothing on"
            await asyncio.sleep(0.05)
            after = await engine.events.list([], ["ev"], 10, int(listed["cursor"]))
        assert [e["type"] for e in after["events"]] == ["job.cancelled"]
    finally:
        await other.stop()


async def test_the_watches_of_a_server_that_stopped_or_died_leave_no_consumer_for_long(nc):
    """Each server follows flags through KV watches: nats-py keeps a watch's consumer 5 minutes after
    no one listens, and servers restarting often filled the stream's 1,000 consumers."""
    js = nc.jetstream()
    engines = [await Engine(await NatsJobStore(nc).start()).start(clocks=False) for _ in range(2)]
    infos = await js.consumers_info("KV_OJS_JOBS")
    for engine in engines:
        await engine.stop()
    assert infos and all(0 < info.config.inactive_threshold <= 30 for info in infos)
    left = {info.name for info in await js.consumers_info("KV_OJS_JOBS")}
    assert not left & {info.name for info in infos}, "a server that stopped cleanly takes its watches along"
