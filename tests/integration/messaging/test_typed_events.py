"""Typed events: one model per event version, checked when written and when handled."""

from __future__ import annotations

import json
import uuid

import psycopg
import pydantic
import pytest

from seamq import Envelope, Event, EventModel, outbox
from seamq.model import ErrorCode, SeamqError
from seamq.registry import Registry, Route

from helpers.handler_service import HandlerService
from helpers import read_stream, wait_for
from helpers.consumer import consuming, inbox, publish, vibe


class VibeCreatedV1(EventModel, context="vibespro", name="vibe_created", version=1,
                    aggregate_type="vibe", aggregate_key="vibe_id"):
    vibe_id: str
    mood: str | None = None
    score: int = 0


class VibeCreatedV2(EventModel, context="vibespro", name="vibe_created", version=2):
    vibe_id: str
    mood: str


def test_the_class_says_which_event_it_is():
    assert str(VibeCreatedV1.seamq_subject) == "vibespro.event.vibe_created.v1"
    with pytest.raises(SeamqError) as exc:
        class Nameless(EventModel):
            a: int
    assert exc.value.code == ErrorCode.INVALID_CONFIG and "context=" in exc.value.message
    with pytest.raises(SeamqError) as exc:
        class BadKey(EventModel, context="sea", name="x", version=1, aggregate_type="t", aggregate_key="id"):
            a: int
    assert "aggregate_key 'id'" in exc.value.message
    with pytest.raises(SeamqError) as exc:
        class BadName(EventModel, context="sea", name="Bad-Name", version=1):
            a: int
    assert exc.value.code == ErrorCode.INVALID_SUBJECT
    with pytest.raises(SeamqError) as exc:
        class Versionless(EventModel, context="sea", name="x"):
            a: int
    assert exc.value.code == ErrorCode.INVALID_CONFIG and "version=" in exc.value.message


def rows(dsn):
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT aggregate_type, aggregate_id, event_type, event_version, payload "
                            "FROM outbox_events ORDER BY aggregate_id").fetchall()


def test_models_are_written_to_the_outbox_and_checked_first(dsn):
    with psycopg.connect(dsn) as conn:
        outbox.add(conn, VibeCreatedV1(vibe_id="v-1", mood="calm"))
        outbox.add(conn, VibeCreatedV2(vibe_id="v-2", mood="bright").event("v-2", aggregate_type="vibe"))
        with pytest.raises(pydantic.ValidationError, match="score"):  # before anything reaches the database
            VibeCreatedV1(vibe_id="v-3", score="high")
        with pytest.raises(SeamqError, match="the aggregate is unknown"):
            outbox.add(conn, VibeCreatedV2(vibe_id="v-4", mood="x"))
        wrong = Event(context="vibespro", aggregate_type="vibe", aggregate_id="v-5", event_type="vibe_created",
                      event_version=1, payload=VibeCreatedV2(vibe_id="v-5", mood="x"))
        with pytest.raises(SeamqError, match="the event is vibespro.event.vibe_created.v1") as exc:
            outbox.add(conn, wrong)
        assert exc.value.code == ErrorCode.INVALID_OUTBOX
    assert rows(dsn) == [
        ("vibe", "v-1", "vibe_created", 1, {"vibe_id": "v-1", "mood": "calm", "score": 0}),
        ("vibe", "v-2", "vibe_created", 2, {"vibe_id": "v-2", "mood": "bright"}),
    ]


handled: dict[uuid.UUID, VibeCreatedV1] = {}


async def on_vibe(envelope: Envelope[VibeCreatedV1], conn) -> None:
    handled[envelope.message_id] = envelope.payload


async def test_a_typed_handler_gets_the_model_and_a_payload_that_does_not_fit_is_dead_lettered(
        dsn, nats_server, nc, topo):
    js = nc.jetstream()
    good = VibeCreatedV1(vibe_id="v-1", mood="calm", score=3).event()
    newer = vibe("v-2", vibe_id="v-2", mood="x", added_later="ignored")  # an optional field a newer producer sends
    bad = vibe("v-3", score="high")  # no vibe_id, and score is not an integer
    await publish(js, [good, newer, bad])
    async with consuming(dsn, nats_server.url, topo, Registry(routes=(Route("vibe_created", 1, on_vibe),))):
        await wait_for(lambda: inbox(dsn, bad.id).get("status") == "dead_lettered", what="bad payload dead-lettered")
        await wait_for(lambda: good.id in handled and newer.id in handled, what="both handled")
    assert handled[good.id] == VibeCreatedV1(vibe_id="v-1", mood="calm", score=3)
    assert isinstance(handled[newer.id], VibeCreatedV1) and handled[newer.id].mood == "x"
    [dead] = await read_stream(js, "SEA_DLQ")
    body = json.loads(dead.data)
    assert dead.headers["Seamq-Dlq-Reason"] == body["reason"] == "schema_mismatch"
    assert "vibe_id: Field required" in body["detail"] and "score: Input should be a valid integer" in body["detail"]


async def test_a_typed_handler_service_gets_the_model_and_its_misfits_are_dead_lettered_as_such(
        dsn, nats_server, nc, topo):
    """The same over HTTP: seamq.http.server parses the payload into the function's model, and a payload
    that does not fit comes back as a 422 the consumer dead-letters as schema_mismatch, naming the fields."""
    received: dict[uuid.UUID, VibeCreatedV1] = {}

    async def on_vibe_over_http(envelope: Envelope[VibeCreatedV1]) -> None:
        received[envelope.message_id] = envelope.payload

    js = nc.jetstream()
    good, bad = VibeCreatedV1(vibe_id="v-1", mood="calm").event(), vibe("v-3", score="high")
    other = vibe("v-4", version=2, vibe_id="v-4", mood="x")  # routed to it by mistake: not its version
    await publish(js, [good, bad, other])
    with HandlerService(handler=on_vibe_over_http) as service:
        async with consuming(dsn, nats_server.url, topo, handler_url=service.url):
            await wait_for(lambda: all(inbox(dsn, e.id).get("status") == "dead_lettered" for e in (bad, other)),
                           what="misfits dead-lettered")
            await wait_for(lambda: good.id in received, what="the good one handled")
    assert received == {good.id: VibeCreatedV1(vibe_id="v-1", mood="calm")}
    dead = {json.loads(m.data)["message_id"]: json.loads(m.data) for m in await read_stream(js, "SEA_DLQ")}
    assert {d["reason"] for d in dead.values()} == {"schema_mismatch"}
    assert "vibe_id: Field required" in dead[str(bad.id)]["detail"]
    assert "takes vibespro.event.vibe_created.v1, not vibespro.event.vibe_created.v2" in dead[str(other.id)]["detail"]


def test_a_route_whose_handler_takes_another_version_is_refused_at_start():
    from seamq.wiring import build_handlers

    with pytest.raises(SeamqError, match="takes vibespro.event.vibe_created.v1") as exc:
        build_handlers(Registry(routes=(Route("vibe_created", 2, on_vibe, source="vibespro"),)), source="vibespro")
    assert exc.value.code == ErrorCode.INVALID_CONFIG


def test_a_model_the_annotation_cannot_reach_is_said_at_start_not_a_dict_on_every_message():
    """Under `from __future__ import annotations` a model defined inside a function is out of the
    annotation's reach: the handler would silently get dict payloads and fail on each message."""
    from seamq.http.server import handler_app
    from seamq.inprocess import InProcessHandler

    class Local(EventModel, context="sea", name="local_thing", version=1):
        n: int

    async def on_local(envelope: Envelope[Local]) -> None:
        pass

    for build in (InProcessHandler, lambda fn: handler_app(fn, secret=None)):
        with pytest.raises(SeamqError, match="'Envelope\\[Local\\]' does not resolve") as exc:
            build(on_local)
        assert exc.value.code == ErrorCode.INVALID_CONFIG and "module level" in str(exc.value)


def test_a_handler_service_can_name_no_other_reason_than_schema_mismatch():
    from seamq.envelope import Reason
    from seamq.http.client import _reason

    assert _reason('{"reason": "schema_mismatch", "error": "x"}') is Reason.SCHEMA_MISMATCH
    for text in ('{"reason": "max_deliver"}', '{"error": "negative total"}', "[1]", "not json", "[" * 100_000):
        assert _reason(text) is None, text[:30]
