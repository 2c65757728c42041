"""Nothing lost to bad input (issue 11): one message's content never ends the consumer or
touches another message, every bad message reaches the DLQ whatever its size, and order
per aggregate holds after transient failures. Real NATS, PostgreSQL and handler service."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import uuid

import psycopg

from seamq.consumer import InboxConsumer
from seamq.dead_letter import original_message
from seamq.model import message_headers
from seamq.nats.publisher import PipelinedPublisher
from seamq.nats.pull import Deliveries, PullSource
from seamq.pg.inbox_repo import PgInbox, consumer_session
from seamq.settings import ConsumerSettings
from seamq.registry import Registry, Route
from seamq.wiring import build_handlers, pg_pool

from helpers import SEAMQ
from helpers import read_stream, scalar, wait_for
from helpers.consumer import CONSUMER, consuming, inbox, publish, settled, vibe

SUBJECT = "vibespro.event.vibe_created.v1"


def deep_json(depth: int) -> bytes:
    return b'{"n": ' + b"[" * depth + b"]" * depth + b"}"


async def dead_letters(js) -> dict[str, dict]:
    return {body["message_id"]: body for body in (json.loads(m.data) for m in await read_stream(js, "SEA_DLQ"))}


async def test_json_nested_100k_deep_is_dead_lettered_and_the_batch_goes_on(dsn, nats_server, nc, topo, service):
    """It raised RecursionError in parsing: the consumer died, and the good message fetched with it
    was redelivered until max_deliver and dropped."""
    js = nc.jetstream()
    before, after = vibe("g", 0), vibe("g", 1)
    bad = vibe("bad")
    await publish(js, [before])
    await js.publish(SUBJECT, b"[" * 100_000 + b"]" * 100_000, headers=message_headers(bad, None))
    await publish(js, [after])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url) as task:
        await wait_for(lambda: settled(js), what="all three settled")
        assert not task.done()  # still consuming
    assert service.handler.handled[str(before.id)] == 1 and service.handler.handled[str(after.id)] == 1
    body = (await dead_letters(js))[str(bad.id)]
    assert body["reason"] == "invalid_json" and "nested too deeply" in body["detail"]
    assert inbox(dsn, bad.id)["status"] == "dead_lettered"


async def test_payload_too_deep_for_the_schema_validator_is_a_schema_mismatch(dsn, nats_server, nc, topo, service):
    """JSON 500 deep parses, but the validator recursed to death and took the lane with it."""
    js = nc.jetstream()
    deep, good = vibe("deep"), vibe("fine")
    await js.publish(SUBJECT, deep_json(500), headers=message_headers(deep, None))
    await publish(js, [good])
    schema = json.dumps({"type": "object", "properties": {"n": {"$ref": "#/$defs/tree"}},
                         "$defs": {"tree": {"type": ["array", "integer"], "items": {"$ref": "#/$defs/tree"}}}})
    registry = Registry(routes=(Route("vibe_created", 1, service.url, schema=schema),))
    async with consuming(dsn, nats_server.url, topo, registry=registry):
        await wait_for(lambda: settled(js), what="both settled")
    assert service.handler.handled[str(good.id)] == 1
    body = (await dead_letters(js))[str(deep.id)]
    assert body["reason"] == "schema_mismatch" and "too deeply" in body["detail"]


class _Raising:
    """A handler that raises instead of returning an outcome: a bug in a wrapper, say."""

    transactional = True

    def __init__(self, inner, bad_aggregate: str) -> None:
        self.inner, self.bad = inner, bad_aggregate

    async def __call__(self, envelope, conn, traceparent=None):
        if envelope.aggregate_id == self.bad:
            raise RuntimeError("a bug in the pipeline")
        return await self.inner(envelope, conn, traceparent)


async def test_a_bug_shown_by_one_message_costs_only_that_message(dsn, nats_server, nc, topo):
    """Handler lookup raising for one event type, a handler raising past its wrappers for one
    aggregate: both are logged, retried and dead-lettered as consumer_error at max_deliver;
    every other message of the same batches is handled once."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE side_effects (message_id uuid, aggregate_id text)")

    async def record(envelope, tx):
        await tx.execute("INSERT INTO side_effects VALUES (%s, %s)", (envelope.message_id, envelope.aggregate_id))

    table = build_handlers(Registry(default=record))

    def lookup(event_type, version):
        if event_type == "vibe_exploded":
            raise KeyError("a bug in the lookup")
        return _Raising(table(event_type, version), "cursed")

    js = nc.jetstream()
    good = [vibe(f"ok-{i % 5}", i) for i in range(40)]
    cursed, exploding = vibe("cursed"), vibe("boom", event_type="vibe_exploded")
    await publish(js, good[:20] + [cursed, exploding] + good[20:])
    spec = topo.consumer(CONSUMER)
    dlq = await PipelinedPublisher(nc).start()
    source = await PullSource(nc, spec.stream, spec.name, buffer=100, deliveries=True).start()
    stop = asyncio.Event()
    async with pg_pool(dsn, configure=consumer_session) as pool:
        consumer = InboxConsumer(spec, Deliveries(source), PgInbox(spec.name, pool), dlq, lookup,
                                 ConsumerSettings(nak_base=0.05, nak_max=0.2, batch_size=50))
        task = asyncio.create_task(consumer.run(stop))
        try:
            await wait_for(lambda: settled(js), what="everything settled")
            assert not task.done()
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await source.close()
            await dlq.close()
    assert scalar(dsn, "SELECT count(*) FROM side_effects") == 40
    assert scalar(dsn, "SELECT count(DISTINCT message_id) FROM side_effects") == 40
    bodies = await dead_letters(js)
    assert bodies[str(exploding.id)]["reason"] == "consumer_error"
    assert "KeyError" in bodies[str(exploding.id)]["detail"]
    assert bodies[str(cursed.id)]["reason"] == "max_deliver"
    assert "consumer error: RuntimeError" in bodies[str(cursed.id)]["detail"]


async def test_a_large_bad_message_is_dead_lettered_by_reference(dsn, nats_server, nc, topo, service):
    """A 900 KB dead letter's body embedding the original no longer fit max_payload: it was never
    dead-lettered and its aggregate's later messages waited behind it."""
    js = nc.jetstream()
    unknown = vibe("big", 0, event_type="vibe_exploded")
    unknown_body = json.dumps({"text": "é\"" * 225_000}, ensure_ascii=False).encode()  # 900 KB; x2.5 escaped
    binary = vibe("big", 1)
    binary_body = hashlib.sha256(b"x").digest() * 28_800  # 900 KB, not UTF-8
    later = vibe("big", 2)
    await js.publish("vibespro.event.vibe_exploded.v1", unknown_body, headers=message_headers(unknown, None))
    await js.publish(SUBJECT, binary_body, headers=message_headers(binary, None))
    await publish(js, [later])
    registry = Registry(routes=(Route("vibe_created", 1, service.url),))
    async with consuming(dsn, nats_server.url, topo, registry=registry):
        await wait_for(lambda: settled(js), timeout=10, what="all settled, none stuck behind a DLQ failure")
    assert service.handler.handled[str(later.id)] == 1
    bodies = await dead_letters(js)
    for event, data, reason in ((unknown, unknown_body, "no_handler"), (binary, binary_body, "invalid_json")):
        body = bodies[str(event.id)]
        assert body["reason"] == reason
        original = original_message(body)
        assert original.data is None and (original.stream, original.seq) == ("VIBESPRO_EVENTS", body["stream_seq"])
        assert original.headers["Nats-Msg-Id"] == str(event.id)
        raw = await js.get_msg(original.stream, original.seq)
        assert raw.data == data
        assert inbox(dsn, event.id)["status"] == "dead_lettered"

    env = {"SEAMQ_DATABASE_URL": dsn, "SEAMQ_NATS__URL": nats_server.url, "PATH": "/usr/bin:/bin"}
    shown = subprocess.run([*SEAMQ, "dlq", "show", str(unknown.id)], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    shown_text = " ".join(shown.stdout.split())
    assert "read from VIBESPRO_EVENTS" in shown_text and "é" in shown_text, shown_text[:3000]
    replayed = subprocess.run([*SEAMQ, "dlq", "replay", str(binary.id)], env=env, capture_output=True, text=True)
    assert replayed.returncode == 0, replayed.stderr
    copies = [m for m in await read_stream(js, "VIBESPRO_EVENTS")
              if (m.headers or {}).get("Seamq-Message-Id") == str(binary.id)]
    assert len(copies) == 1 and copies[0].data == binary_body


async def test_order_per_aggregate_holds_after_transient_failures(dsn, nats_server, nc, topo):
    """One process, no faults, 2% of messages failing on their first delivery: an aggregate's
    held messages overtook each other (22 before 21), and fresh ones overtook held ones."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE handled (id bigserial PRIMARY KEY, aggregate_id text, n int, message_id uuid)")

    def fails_first(message_id: uuid.UUID) -> bool:
        return message_id.int % 50 == 0

    async def handler(envelope, tx):
        if envelope.delivery_attempt == 1 and fails_first(envelope.message_id):
            raise RuntimeError("transient")
        await tx.execute("INSERT INTO handled (aggregate_id, n, message_id) VALUES (%s, %s, %s)",
                         (envelope.aggregate_id, envelope.payload["n"], envelope.message_id))

    js = nc.jetstream()
    events = [vibe(f"o-{a}", n) for n in range(25) for a in range(200)]
    assert sum(fails_first(e.id) for e in events) > 50
    await publish(js, events)
    async with consuming(dsn, nats_server.url, topo, registry=Registry(default=handler), concurrency=4):
        await wait_for(lambda: settled(js), timeout=240, what="all 5,000 handled")  # a liveness wait, not a rate
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT aggregate_id, n FROM handled ORDER BY id").fetchall()
    by_aggregate: dict[str, list[int]] = {}
    for aggregate, n in rows:
        by_aggregate.setdefault(aggregate, []).append(n)
    out_of_order = {a: ns for a, ns in by_aggregate.items() if ns != list(range(25))}
    assert len(rows) == 5000 and not out_of_order


async def test_handlers_see_the_delivery_attempt_and_a_rerun(dsn, nats_server, nc, topo, service):
    """HTTP handlers get delivery_attempt in the body; an in-process handler whose lane is redone
    (another handler in its transaction failed) is told that its call is a rerun."""
    js = nc.jetstream()
    event = vibe("twice")
    service.handler.script["twice"] = ["fail"]
    await publish(js, [event])
    async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
        # What the test is about, then the consumer's own count: once, "settled" came first on a busy
        # machine (run 2 of session 15) with no delivery seen at all.
        await wait_for(lambda: service.handler.deliveries[str(event.id)] == [1, 2], what="a second delivery")
        await wait_for(lambda: settled(js), what="acked")
    assert service.handler.deliveries[str(event.id)] == [1, 2]

    calls = []

    async def handler(envelope, tx):
        calls.append((envelope.aggregate_id, envelope.delivery_attempt, envelope.rerun))
        if envelope.aggregate_id == "fails" and envelope.delivery_attempt == 1:
            raise RuntimeError("transient")

    first, second = vibe("fine"), vibe("fails")
    await publish(js, [first, second])
    async with consuming(dsn, nats_server.url, topo, registry=Registry(default=handler), concurrency=1):
        await wait_for(lambda: settled(js), what="both handled")
    # One lane transaction held both: the failure redid it, and "fine" was told its second call repeats.
    assert [c for c in calls if c[0] == "fine"] == [("fine", 1, False), ("fine", 1, True)]
    assert [c for c in calls if c[0] == "fails"] == [("fails", 1, False), ("fails", 1, True), ("fails", 2, False)]
