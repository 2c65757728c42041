"""The inbox consumer against real NATS, PostgreSQL and a real HTTP handler service."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid

import psycopg
import pytest

from seamq.model import message_headers
from seamq.registry import Registry, Route
from seamq.wiring import run_consumer

from helpers import FAST_TOPOLOGY, SEAMQ, TESTS
from helpers import fetch_one, read_stream, scalar, wait_for
from helpers.consumer import CONSUMER, _pulls, attempts, consuming, inbox, publish, settings, settled, vibe

async def test_two_copies_with_one_msg_id_are_handled_once(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe()
    await publish(js, [event])
    await asyncio.sleep(1.2)  # past the 1 s duplicate window: JetStream stores a second copy
    await publish(js, [event])
    same_batch = vibe("v-2")
    await publish(js, [same_batch])
    await asyncio.sleep(1.2)
    await publish(js, [same_batch])
    assert (await js.stream_info("VIBESPRO_EVENTS")).state.messages == 4
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: settled(js), what="all four copies settled")
    assert service.handler.handled == {str(event.id): 1, str(same_batch.id): 1}
    assert inbox(dsn, event.id)["duplicates"] == 1 and inbox(dsn, same_batch.id)["duplicates"] == 1
    assert inbox(dsn, event.id)["status"] == "processed"


async def test_500_then_recovery_redelivers_and_counts_attempts(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe("flaky")
    service.handler.script["flaky"] = ["fail", "fail"]
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "processed", what="processed after 2 failures")
        await wait_for(lambda: settled(js), what="acked")
    assert service.handler.calls[str(event.id)] == 3
    assert service.handler.handled[str(event.id)] == 1
    row = inbox(dsn, event.id)
    assert row["attempts"] == 3 and row["processed_at"] >= row["received_at"]
    assert "scripted transient failure" in row["last_error"], "the last error stays after the retry succeeded"
    assert [(n, "HTTP 500" in error) for n, error in attempts(dsn, event.id)] == [(1, True), (2, True)]


async def test_messages_held_behind_a_failure_keep_their_order_and_are_not_lost(dsn, nats_server, nc, topo, service):
    """The messages of an aggregate held behind its failed one come back after it, in order.
    And new inbox rows go in marked processed, so the lane must put back every one that was
    not: the failed message and those held behind it in the same transaction."""
    js = nc.jetstream()
    events = [vibe("held", n) for n in range(5)]
    service.handler.script["held"] = ["fail", "fail"]
    await publish(js, events)
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: settled(js), what="all handled after the failures")
    assert [n for aggregate, n in service.handler.order if aggregate == "held"] == list(range(5))
    assert all(service.handler.handled[str(e.id)] == 1 for e in events)
    rows = [inbox(dsn, e.id) for e in events]
    assert all(r["status"] == "processed" and r["processed_at"] >= r["received_at"] for r in rows)
    assert rows[0]["attempts"] == 3 and [n for n, _ in attempts(dsn, events[0].id)] == [1, 2]
    assert all(r["attempts"] == 1 and not attempts(dsn, r["message_id"]) for r in rows[1:]), "holds are no attempts"


async def test_a_good_message_held_more_often_than_max_deliver_is_handled_not_dead_lettered(
        dsn, nats_server, nc, topo, service):
    """Found in the soak: every delivery that held a message behind its aggregate counted against
    max_deliver (4 here), and JetStream's own limit stopped delivering it. A message that fails
    twice while held behind one that fails three times is good: it must be handled, in order."""
    js = nc.jetstream()
    blocker, patient, last = [vibe("patient", n) for n in range(3)]
    service.handler.script["patient"] = ["fail"] * 3 + ["ok"] + ["fail"] * 2  # calls come in stream order
    await publish(js, [blocker, patient, last])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: settled(js), what="all handled")
    assert [n for aggregate, n in service.handler.order if aggregate == "patient"] == [0, 1, 2]
    assert [inbox(dsn, e.id)["status"] for e in (blocker, patient, last)] == ["processed"] * 3
    assert [inbox(dsn, e.id)["attempts"] for e in (blocker, patient, last)] == [4, 3, 1]
    assert not await read_stream(js, "SEA_DLQ")
    info = await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)
    assert info.config.max_deliver == -1, "JetStream never stops delivering in silence"


async def test_messages_held_behind_a_message_that_exhausts_max_deliver_are_handled(
        dsn, nats_server, nc, topo, service):
    """When the failing one is dead-lettered at max_deliver (4 here), the messages held behind it
    must be handled, not left undeliverable."""
    js = nc.jetstream()
    blocker, *later = [vibe("stuck", n) for n in range(3)]
    service.handler.script["stuck"] = ["fail"] * 4
    await publish(js, [blocker, *later])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: settled(js), what="all settled")
    assert inbox(dsn, blocker.id)["dlq_metadata"]["reason"] == "max_deliver"
    assert [n for aggregate, n in service.handler.order if aggregate == "stuck"] == [1, 2]
    assert all(inbox(dsn, e.id)["status"] == "processed" for e in later)


async def test_422_goes_to_dlq_marks_failed_and_acks(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe("bad", total=-1)
    good = vibe("good")
    service.handler.script["bad"] = ["poison"]
    await publish(js, [event, good])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: settled(js), what="both settled")
        await asyncio.sleep(2.5)  # longer than ack_wait: an unacked original would come back
    assert service.handler.calls[str(event.id)] == 1  # ACKed: never delivered again
    assert service.handler.handled[str(good.id)] == 1
    row = inbox(dsn, event.id)
    assert row["status"] == "dead_lettered" and row["processed_at"] is None
    assert row["dlq_metadata"]["reason"] == "handler_rejected"
    [dead] = await read_stream(js, "SEA_DLQ")
    assert dead.subject == "sea.dlq.vibespro.vibe_created.v1"
    body = json.loads(dead.data)
    assert body["message_id"] == str(event.id) and body["original_subject"] == "vibespro.event.vibe_created.v1"
    assert body["reason"] == "handler_rejected" and "total must be positive" in body["detail"]
    assert body["attempts"] == 1 and json.loads(body["original_payload"]) == {"n": 0, "total": -1}
    assert body["original_headers"]["Nats-Msg-Id"] == str(event.id)


async def test_handler_timeout_behaves_like_5xx(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe("slow")
    service.handler.script["slow"] = ["sleep:1.5"]
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url, handler_timeout=0.5):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "processed", what="processed after timeout")
    row = inbox(dsn, event.id)
    assert row["attempts"] == 2 and service.handler.calls[str(event.id)] == 2


async def test_max_deliver_routes_to_dlq(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe("always_down")
    service.handler.script["always_down"] = ["fail"] * 10
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "dead_lettered", what="max_deliver dead letter")
        await wait_for(lambda: settled(js), what="acked")
    assert service.handler.calls[str(event.id)] == 4  # topology max_deliver
    [dead] = await read_stream(js, "SEA_DLQ")
    body = json.loads(dead.data)
    assert body["reason"] == "max_deliver" and body["attempts"] == 4
    assert inbox(dsn, event.id)["attempts"] == 4


async def test_malformed_input_is_dead_lettered_and_good_messages_flow(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    good_before, good_after = vibe("g-1"), vibe("g-2")
    valid = message_headers(vibe(), None)
    bad_json_id, no_agg_id, unknown_id, bad_version_id = (str(uuid.uuid4()) for _ in range(4))
    await publish(js, [good_before])
    subject = "vibespro.event.vibe_created.v1"
    await js.publish(subject, b'{"n": 1}', headers={k: v for k, v in valid.items() if k != "Nats-Msg-Id"})
    await js.publish(subject, b'{"n": 1}', headers={**valid, "Nats-Msg-Id": "not-a-uuid"})
    await js.publish(subject, b'{"n": oops', headers={**valid, "Nats-Msg-Id": bad_json_id})
    await js.publish(subject, b'{"n": 1}', headers={"Nats-Msg-Id": no_agg_id})
    await js.publish("vibespro.event.vibe_exploded.v1", b"{}", headers={
        **message_headers(vibe(event_type="vibe_exploded"), None), "Nats-Msg-Id": unknown_id})
    await js.publish("vibespro.event.vibe_created.v9", b"{}", headers={
        **message_headers(vibe(version=9), None), "Nats-Msg-Id": bad_version_id})
    await js.publish("vibespro.event.Not-Valid.v1", b"{}", headers={**valid, "Nats-Msg-Id": str(uuid.uuid4())})
    await publish(js, [good_after])
    registry = Registry(routes=(Route("vibe_created", 1, service.url),))
    async with consuming(dsn, nats_server.url, topo, registry=registry):
        await wait_for(lambda: settled(js), what="every message settled")
    assert service.handler.handled[str(good_before.id)] == 1 and service.handler.handled[str(good_after.id)] == 1
    reasons = sorted(json.loads(m.data)["reason"] for m in await read_stream(js, "SEA_DLQ"))
    assert reasons == sorted(["missing_msg_id", "invalid_msg_id", "invalid_json", "invalid_envelope",
                              "no_handler", "no_handler", "invalid_subject"])
    assert inbox(dsn, unknown_id)["status"] == "dead_lettered"
    assert inbox(dsn, bad_version_id)["dlq_metadata"]["reason"] == "no_handler"
    assert "Seamq-Aggregate-Type" in inbox(dsn, no_agg_id)["last_error"]


async def test_bad_signature_is_retried_not_dead_lettered_and_readiness_says_so(dsn, nats_server, nc, topo, service):
    """A wrong or missing handler secret made every call a 401 while /readyz stayed ok."""
    from seamq.health import Health

    js = nc.jetstream()
    event = vibe()
    await publish(js, [event])
    health = Health()
    stop = asyncio.Event()
    # Retries a second or more apart: the secret is fixed long before max_deliver (4), however busy the machine.
    wrong = settings(dsn, nats_server.url, handler_url=service.url, handler_secret="wrong", nak_base=2.0, nak_max=4.0)
    task = asyncio.create_task(run_consumer(wrong, topo, CONSUMER, stop, health=health))
    try:
        await wait_for(lambda: (inbox(dsn, event.id).get("attempts") or 0) >= 1, what="a refused attempt")
        ready = await health.ready()
        assert not ready.ok and "refuses the signature (401)" in ready.checks["handler_signature"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):  # the secret fixed
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "processed", what="handled with the right secret")
    row = inbox(dsn, event.id)
    assert "401" in row["last_error"] and "signature" in row["last_error"]
    assert service.handler.calls[str(event.id)] == 1, "retried as transient, never dead-lettered as poison"


async def test_in_process_handler_commits_with_the_inbox(dsn, nats_server, nc, topo):
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE side_effects (message_id uuid, aggregate_id text)")
    calls = []

    async def handler(envelope, tx):
        calls.append(envelope.message_id)
        await tx.execute("INSERT INTO side_effects VALUES (%s, %s)", (envelope.message_id, envelope.aggregate_id))
        if len(calls) == 1:
            raise RuntimeError("fails after writing: the write must roll back")

    js = nc.jetstream()
    event = vibe()
    await publish(js, [event])
    registry = Registry(default=handler)
    async with consuming(dsn, nats_server.url, topo, registry=registry):
        await wait_for(lambda: inbox(dsn, event.id).get("status") == "processed", what="processed")
    assert len(calls) == 2
    assert scalar(dsn, "SELECT count(*) FROM side_effects") == 1  # the failed attempt's write rolled back


async def test_per_aggregate_order_with_concurrency(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    events = [vibe(f"a-{a}", n) for n in range(30) for a in range(8)]
    service.handler.script["a-3"] = ["sleep:0.05"] * 10
    await publish(js, events)
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url, concurrency=8):
        await wait_for(lambda: settled(js), timeout=60, what="all handled")
    by_aggregate: dict[str, list[int]] = {}
    for aggregate, n in service.handler.order:
        by_aggregate.setdefault(aggregate, []).append(n)
    assert len(by_aggregate) == 8 and all(ns == list(range(30)) for ns in by_aggregate.values())


@pytest.fixture
def side_effects_env(dsn, tmp_path, service_env):
    """Environment for `seamq consume` subprocesses whose in-process handler writes a row per
    message into side_effects (no unique key, so a double would show)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE side_effects (message_id uuid, aggregate_id text)")
    topology_file = tmp_path / "topology.yaml"
    topology_file.write_text(FAST_TOPOLOGY)
    return dict(service_env, PYTHONPATH=str(TESTS),
                SEAMQ_CONSUMER__REGISTRY="helpers.inprocess_handlers:REGISTRY", SEAMQ_TOPOLOGY_FILE=str(topology_file))


async def test_kill_9_mid_batch_then_restart_side_effects_exactly_once(dsn, nats_server, nc, topo, side_effects_env):
    js = nc.jetstream()
    events = [vibe(f"k-{i % 40}", i) for i in range(1500)]
    await publish(js, events)
    env = dict(side_effects_env, HANDLER_SLEEP="0.002")
    argv = [*SEAMQ, "consume", "--consumer", CONSUMER]
    for _ in range(2):  # two kills mid-run
        worker = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
        await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM side_effects") > 100, what="progress")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    worker = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        await wait_for(lambda: settled(js), timeout=120, what="everything processed after restarts")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    total, distinct = fetch_one(dsn, "SELECT count(*), count(DISTINCT message_id) FROM side_effects")
    assert (total, distinct) == (1500, 1500)
    assert scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == 1500


async def test_two_processes_share_one_durable_consumer(dsn, nats_server, nc, topo, side_effects_env):
    js = nc.jetstream()
    workers = [subprocess.Popen([*SEAMQ, "consume", "--consumer", CONSUMER], env=side_effects_env,
                                stderr=subprocess.DEVNULL)
               for _ in range(2)]
    try:
        # Both pulling before anything is published: otherwise the first may finish it all while the
        # second is still importing, and a SIGTERM before a worker's handler is installed kills it (-15)
        await wait_for(lambda: _pulls(js, 2), timeout=60, what="both processes pulling")
        await publish(js, [vibe(f"s-{i % 25}", i) for i in range(1000)])
        await wait_for(lambda: settled(js), timeout=120, what="all processed")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        assert [w.wait(30) for w in workers] == [0, 0]
    assert scalar(dsn, "SELECT count(*) FROM side_effects") == 1000


def test_inbox_purge_refuses_a_window_shorter_than_redelivery(dsn):
    env = {"SEAMQ_DATABASE_URL": dsn, "PATH": os.environ["PATH"]}
    short = subprocess.run([*SEAMQ, "inbox", "purge", "--older-than", "30m"], env=env, capture_output=True, text=True)
    assert short.returncode == 2 and "too short" in short.stderr
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO inbox_messages (message_id, subject, consumer, status, received_at, processed_at) "
                     "SELECT gen_random_uuid(), 's', 'c', 'processed', now() - interval '40 days', "
                     "now() - interval '40 days' FROM generate_series(1, 12)")
        conn.execute("INSERT INTO inbox_messages (message_id, subject, consumer) VALUES (gen_random_uuid(), 's', 'c')")
    ok = subprocess.run([*SEAMQ, "inbox", "purge", "--older-than", "30d", "--batch", "5"], env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "deleted 12 rows" in ok.stdout and scalar(dsn, "SELECT count(*) FROM inbox_messages") == 1


async def test_sigterm_finishes_in_flight_and_acks(dsn, nats_server, nc, topo, tmp_path, side_effects_env):
    js = nc.jetstream()
    await publish(js, [vibe(f"t-{i % 10}", i) for i in range(400)])
    topology_file = tmp_path / "topology-slow-ack.yaml"
    topology_file.write_text(FAST_TOPOLOGY.replace("ack_wait: 2s", "ack_wait: 60s"))
    env = dict(side_effects_env, HANDLER_SLEEP="0.01", SEAMQ_TOPOLOGY_FILE=str(topology_file))
    worker = subprocess.Popen([*SEAMQ, "consume", "--consumer", CONSUMER], env=env, stderr=subprocess.DEVNULL)
    await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM side_effects") > 20, what="progress")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    info = await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)
    # Nothing left waiting for ack_wait (60 s): what was in hand was finished and ACKed.
    assert info.num_ack_pending == 0
    handled = scalar(dsn, "SELECT count(*) FROM side_effects")
    assert handled == scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'")
    assert info.num_pending == 400 - handled


async def test_trace_context_continues_to_the_handler(dsn, nats_server, nc, topo):
    seen = []

    async def handler(envelope, tx):
        from opentelemetry import propagate

        carrier = {}
        propagate.inject(carrier)
        seen.append(carrier.get("traceparent"))

    js = nc.jetstream()
    event = vibe()
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, registry=Registry(default=handler)):
        await wait_for(lambda: settled(js), what="handled")
    # The relay's traceparent carries the outbox id as trace id; the handler runs inside that trace.
    assert seen and seen[0].split("-")[1] == event.id.hex


async def test_inbox_off_is_at_least_once(dsn, nats_server, nc, topo, service):
    js = nc.jetstream()
    event = vibe()
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url, inbox=False):
        await wait_for(lambda: settled(js), what="first copy acked")
        await asyncio.sleep(1.2)
        await publish(js, [event])  # a second copy outside the duplicate window
        await wait_for(lambda: service.handler.handled[str(event.id)] == 2, what="second copy handled")
    assert service.handler.handled[str(event.id)] == 2  # no inbox: both copies reach the handler
    assert inbox(dsn, event.id) == {}
