"""DLQ replay (REQ-059) and DLQ operations against real NATS, PostgreSQL and a handler service."""

from __future__ import annotations

import asyncio
import json
import subprocess
from contextlib import asynccontextmanager
from datetime import datetime


from seamq.registry import Registry, Route
from seamq.wiring import run_replay
from seamq.settings import ReplaySettings

from helpers import SEAMQ
from helpers import read_stream, wait_for
from helpers.consumer import consuming, inbox, publish, settings, vibe

FAST = dict(base_delay=1.0, factor=2.0, max_delay=4.0, jitter=0.5, interval=0.1,
            reasons=["max_deliver", "handler_rejected"])  # handler_rejected too: its replays are what is tested


@asynccontextmanager
async def replaying(dsn, nats_url, topology, **replay):
    current = settings(dsn, nats_url).model_copy(update={"replay": ReplaySettings(**{**FAST, **replay})})
    stop = asyncio.Event()
    task = asyncio.create_task(run_replay(current, topology, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def when(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_poison_once_is_replayed_within_jitter_bounds_and_processed_once(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe("p-1")
    service.handler.script["p-1"] = ["poison"]  # 422 the first time only
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url), \
            replaying(dsn, nats_server.url, topo):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "processed", timeout=20, what="replayed")
    row = inbox(dsn, event.id)
    meta = row["dlq_metadata"]
    low, high = ReplaySettings(base_delay=1.0, factor=2.0, max_delay=4.0, jitter=0.5).policy().bounds(0)
    assert low <= meta["replay_delay"] <= high
    waited = (when(meta["last_replayed_at"]) - when(meta["replay_scheduled_at"])).total_seconds()
    assert meta["replay_delay"] <= waited <= meta["replay_delay"] + 2.0  # replayed when due, not before
    assert meta["replay_attempts"] == 1 and meta["last_reason"] == "handler_rejected"
    assert "next_replay_at" not in meta  # handled: no replay comes next (`seamq inbox show` showed one)
    assert service.handler.calls[str(event.id)] == 2 and service.handler.handled[str(event.id)] == 1
    assert len(await read_stream(js, "SEA_DLQ")) == 1


async def test_at_the_cap_the_message_stays_dead_lettered_and_exhausted(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe("p-2")
    service.handler.script["p-2"] = ["poison"] * 10
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url), \
            replaying(dsn, nats_server.url, topo, max_attempts=2, base_delay=0.2, max_delay=0.4):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "exhausted", timeout=20, what="exhausted")
        await asyncio.sleep(1.0)  # no further replay once exhausted
    meta = inbox(dsn, event.id)["dlq_metadata"]
    assert meta["replay_attempts"] == 2 and "exhausted_at" in meta
    assert service.handler.calls[str(event.id)] == 3  # the first delivery and two replays
    assert [json.loads(m.data)["reason"] for m in await read_stream(js, "SEA_DLQ")] == ["handler_rejected"] * 3


async def test_malformed_input_is_not_replayed_automatically(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    unknown = vibe("x", event_type="vibe_exploded")
    await publish(js, [unknown])
    registry = Registry(routes=(Route("vibe_created", 1, service.url),))
    async with consuming(dsn, nats_server.url, topo, registry=registry), replaying(dsn, nats_server.url, topo):
        await wait_for(lambda: inbox(dsn, unknown.id).get("status") == "dead_lettered", what="dead letter")
        await asyncio.sleep(1.5)
    meta = inbox(dsn, unknown.id)["dlq_metadata"]
    assert meta["reason"] == "no_handler" and "replay_attempts" not in meta and meta["next_replay_at"] is None


async def test_dlq_replay_all_brings_back_every_selected_message(dsn, nats_server, nc, topo, service, service_env):
    js = nc.jetstream()
    v2 = [vibe(f"n-{i}", version=2) for i in range(5)]
    other = vibe("keep", event_type="vibe_exploded")
    await publish(js, v2 + [other])
    only_v1 = Registry(routes=(Route("vibe_created", 1, service.url),))
    async with consuming(dsn, nats_server.url, topo, registry=only_v1):
        await wait_for(lambda: all(inbox(dsn, e.id).get("status") == "dead_lettered" for e in v2 + [other]),
                       what="all dead-lettered as no_handler")
    listing = subprocess.run([*SEAMQ, "dlq", "list", "--event-type", "vibe_created"], env=service_env,
                             capture_output=True, text=True)
    assert listing.returncode == 0 and "5 dead letters" in listing.stdout and "no_handler" in listing.stdout
    assert all(str(e.id) in listing.stdout for e in v2)  # whole, even 80 columns wide: their heads are shared
    shown = subprocess.run([*SEAMQ, "dlq", "show", str(v2[0].id)], env=service_env, capture_output=True, text=True)
    assert shown.returncode == 0 and "original_payload" in shown.stdout and "no_handler" in shown.stdout

    with_v2 = Registry(routes=(Route("vibe_created", 1, service.url), Route("vibe_created", 2, service.url)))
    async with consuming(dsn, nats_server.url, topo, registry=with_v2):  # the fix is deployed
        result = subprocess.run([*SEAMQ, "dlq", "replay", "--all", "--event-type", "vibe_created"],
                                env=service_env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert "replayed 5 of 5" in result.stdout
        await wait_for(lambda: all(inbox(dsn, e.id).get("status") == "processed" for e in v2), what="replays handled")
    assert all(service.handler.handled[str(e.id)] == 1 for e in v2)
    assert inbox(dsn, other.id)["status"] == "dead_lettered"  # not selected, not touched


async def test_dlq_purge_needs_yes_and_keeps_dedup(dsn, nats_server, nc, topo, service, service_env):
    js = nc.jetstream()
    event = vibe("z", event_type="vibe_exploded")
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, registry=Registry(routes=(Route("vibe_created", 1, service.url),))):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "dead_lettered", what="dead letter")
    refused = subprocess.run([*SEAMQ, "dlq", "purge"], env=service_env, capture_output=True, text=True)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert len(await read_stream(js, "SEA_DLQ")) == 1
    done = subprocess.run([*SEAMQ, "dlq", "purge", "--yes"], env=service_env, capture_output=True, text=True)
    assert done.returncode == 0 and "purged 1" in done.stdout
    assert (await js.stream_info("SEA_DLQ")).state.messages == 0
    row = inbox(dsn, event.id)
    assert row["status"] == "exhausted" and "purged_at" in row["dlq_metadata"]


def test_dlq_replay_unknown_id(dsn, service_env):
    result = subprocess.run([*SEAMQ, "dlq", "replay", "00000000-0000-0000-0000-000000000000"],
                            env=service_env, capture_output=True, text=True)
    assert result.returncode == 2 and "NOT_FOUND" in result.stderr


TWO_CONSUMERS = """
contexts:
  sea: {}
  billing: {}
  vibespro: {}
consumers:
  sea__from_vibespro: {ack_wait: 2s, max_deliver: 4}
  billing__from_vibespro: {ack_wait: 2s, max_deliver: 4}
"""


async def test_a_replay_runs_only_in_the_consumer_it_is_for_and_each_consumers_replay_is_delivered(
        dsn, nats_server, nc, tmp_path, service_env):
    """Two consumers dead-letter one message. `dlq replay ID --consumer sea__...` re-ran it in both; then
    the replay worker's replay for billing had the same Nats-Msg-Id (`replay:{id}:1`), JetStream dropped it
    inside its duplicate window, and it was still logged and counted as replayed."""
    from seamq.envelope import Poison
    from seamq.nats.provision import apply
    from seamq.topology import load_topology
    from seamq.wiring import run_consumer

    path = tmp_path / "topology.yaml"
    path.write_text(TWO_CONSUMERS)
    topology = load_topology(path)
    await apply(nc.jetstream(), topology)
    calls: dict[str, int] = {}

    def handler(name):
        async def handle(envelope, tx):
            if envelope.rerun:  # the consumer redoes a failed in-process call under a savepoint
                calls[name] -= 1
            calls[name] = calls.get(name, 0) + 1
            if not envelope.replay_attempt:
                raise Poison("not yet")
        return Registry(routes=(Route("vibe_created", 1, handle),))

    def row(consumer):
        import psycopg
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT status, dlq_metadata FROM inbox_messages WHERE consumer = %s", (consumer,)
                                ).fetchone() or (None, None)

    js = nc.jetstream()
    event = vibe("both")
    await publish(js, [event])
    stop = asyncio.Event()
    workers = [asyncio.create_task(run_consumer(settings(dsn, nats_server.url), topology, name, stop, handler(name)))
               for name in ("sea__from_vibespro", "billing__from_vibespro")]
    try:
        await wait_for(lambda: row("sea__from_vibespro")[0] == row("billing__from_vibespro")[0] == "dead_lettered",
                       what="dead-lettered by both")
        env = dict(service_env, SEAMQ_TOPOLOGY_FILE=str(path))
        result = subprocess.run([*SEAMQ, "dlq", "replay", str(event.id), "--consumer", "sea__from_vibespro"],
                                env=env, capture_output=True, text=True)
        assert result.returncode == 0 and "replayed 1 of 1" in result.stdout, result.stderr
        await wait_for(lambda: row("sea__from_vibespro")[0] == "processed", what="sea's replay handled")
        await asyncio.sleep(1.0)  # billing had it too: it must not run it
        assert (calls["billing__from_vibespro"], row("billing__from_vibespro")[0]) == (1, "dead_lettered")
        last = (await js.stream_info("VIBESPRO_EVENTS")).state.last_seq
        async with replaying(dsn, nats_server.url, topology, base_delay=0.1, max_delay=0.2):
            await wait_for(lambda: row("billing__from_vibespro")[0] == "processed", what="billing's replay handled")
        assert (await js.stream_info("VIBESPRO_EVENTS")).state.last_seq == last + 1
        assert calls == {"sea__from_vibespro": 2, "billing__from_vibespro": 2}
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)


async def test_an_edited_copy_runs_only_in_the_consumer_that_dead_lettered_it_and_a_bad_edit_sends_nothing(
        dsn, nats_server, nc, tmp_path):
    """Edit and replay (seamq.dlq_desk, the console's): a new message for one consumer; the original closed;
    an edit that is not a JSON object, or of a dead letter closed already, is refused and sends nothing."""
    import psycopg
    import pytest

    from seamq.envelope import Poison
    from seamq.model import SeamqError
    from seamq.nats.provision import apply
    from seamq.dead_letter import DlqFilter
    from seamq.topology import load_topology
    from seamq.wiring import dlq_desk, run_consumer

    path = tmp_path / "topology.yaml"
    path.write_text(TWO_CONSUMERS)
    topology = load_topology(path)
    await apply(nc.jetstream(), topology)
    seen: dict[str, list] = {"sea__from_vibespro": [], "billing__from_vibespro": []}

    def handler(name):
        async def handle(envelope, tx):
            seen[name].append(envelope.payload)
            if name == "sea__from_vibespro" and not envelope.payload.get("fixed"):
                raise Poison("total must be positive")
        return Registry(routes=(Route("vibe_created", 1, handle),))

    def status(consumer, message_id):
        with psycopg.connect(dsn) as conn:
            found = conn.execute("SELECT status FROM inbox_messages WHERE consumer = %s AND message_id = %s",
                                 (consumer, message_id)).fetchone()
            return found[0] if found else None

    js = nc.jetstream()
    event = vibe("edit-me")
    await publish(js, [event])
    stop = asyncio.Event()
    current = settings(dsn, nats_server.url)
    workers = [asyncio.create_task(run_consumer(current, topology, name, stop, handler(name)))
               for name in seen]
    try:
        await wait_for(lambda: status("sea__from_vibespro", event.id) == "dead_lettered", what="dead-lettered")
        await wait_for(lambda: status("billing__from_vibespro", event.id) == "processed", what="billing's")
        async with dlq_desk(current, topology) as desk:
            [row] = await desk.select(DlqFilter(ids=[event.id]))
            last = (await js.stream_info("VIBESPRO_EVENTS")).state.last_seq
            for bad in (b"[1, 2]", b"{not json", b"\xff"):
                with pytest.raises(SeamqError) as refused:
                    await desk.edit_and_replay(row, bad, "test:ada")
                assert refused.value.code.value == "INVALID_INPUT"
            assert (await js.stream_info("VIBESPRO_EVENTS")).state.last_seq == last
            new_id = await desk.edit_and_replay(row, b'{"n": 1, "fixed": true}', "test:ada")
            with pytest.raises(SeamqError) as again:  # closed now: a second edit sends nothing
                await desk.edit_and_replay(row, b'{"n": 2, "fixed": true}', "test:ada")
            assert again.value.code.value == "NOT_FOUND"
            actions = await desk.actions()
        await wait_for(lambda: status("sea__from_vibespro", new_id) == "processed", what="the edited copy handled")
        async def billing_acked_it():  # billing received it too, and must neither run nor record it
            return (await js.consumer_info("VIBESPRO_EVENTS", "billing__from_vibespro")).ack_floor.stream_seq > last
        await wait_for(billing_acked_it, what="billing's consumer past the edited copy")
        assert status("billing__from_vibespro", new_id) is None
        assert seen["billing__from_vibespro"] == [{"n": 0}]
        assert seen["sea__from_vibespro"][-1] == {"n": 1, "fixed": True}
        assert (await js.stream_info("VIBESPRO_EVENTS")).state.last_seq == last + 1
        assert status("sea__from_vibespro", event.id) == "exhausted"
        assert [(a.action, a.selected, a.done, a.finished_at is not None) for a in actions][:2] == [
            ("dlq.edit_replay", 1, 0, True), ("dlq.edit_replay", 1, 1, True)]
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
