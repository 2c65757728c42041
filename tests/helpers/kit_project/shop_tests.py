"""A user's handler tests, written with seamq.testing: run by tests/integration/messaging/test_testing_kit.py in a project of their own."""

from seamq import Event
from shop import VibeCreatedV1, on_vibe_created

async def test_ok(seamq_harness):
    out = await seamq_harness.deliver(on_vibe_created, VibeCreatedV1(vibe_id="v-1", mood="calm"))
    assert out.acked and out.committed, out
    assert out.envelope.payload.mood == "calm"
    assert out.statements == [("INSERT INTO vibes (id, mood) VALUES (%s, %s)", ("v-1", "calm"))]

async def test_poison(seamq_harness):
    out = await seamq_harness.deliver(on_vibe_created, VibeCreatedV1(vibe_id="v-1", mood="angry"))
    assert out.dead_lettered and out.reason == "handler_rejected" and not out.committed

async def test_retry_then_max(seamq_harness):
    out = await seamq_harness.deliver(on_vibe_created, VibeCreatedV1(vibe_id="v-1", mood="flaky"))
    assert out.retried and "downstream away" in out.detail
    out = await seamq_harness.deliver(on_vibe_created, VibeCreatedV1(vibe_id="v-1", mood="flaky"), delivered=20)
    assert out.reason == "max_deliver"

async def test_bad_payload(seamq_harness):
    bad = Event(context="vibespro", aggregate_type="vibe", aggregate_id="v-2", event_type="vibe_created",
                payload={"mood": "calm", "score": "high"})
    out = await seamq_harness.deliver(on_vibe_created, bad)
    assert out.reason == "schema_mismatch", out
    assert "vibe_id" in out.detail and "score" in out.detail

async def test_the_http_service(seamq_harness):
    from shop import app
    out = await seamq_harness.deliver_http(app, VibeCreatedV1(vibe_id="v-1", mood="calm"), secret="kit-secret")
    assert out.acked and out.committed, out
    out = await seamq_harness.deliver_http(app, VibeCreatedV1(vibe_id="v-1", mood="angry"), secret="kit-secret")
    assert out.reason == "handler_rejected" and "no angry vibes" in out.detail
    out = await seamq_harness.deliver_http(app, Event(context="vibespro", aggregate_type="vibe", aggregate_id="v-2",
                                                      event_type="vibe_created", payload={"mood": "calm"}),
                                           secret="kit-secret")
    assert out.reason == "schema_mismatch" and "vibe_id" in out.detail
