"""One trace from the producer's span to the handler: outbox.add -> relay publish -> consumer handling.

The OpenTelemetry SDK with its in-memory exporter records what a user's
exporter would receive; real PostgreSQL, nats-server and the real workers.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import seamq.observability
from seamq import outbox
from seamq.model import traceparent_for
from seamq.registry import Registry, Route
from seamq.settings import NatsSettings, RelaySettings, Settings
from seamq.wiring import run_relay

from helpers import wait_for
from helpers.consumer import consuming, vibe

seen: dict[str, trace.SpanContext] = {}


async def remember_span(envelope, conn) -> None:
    seen[str(envelope.message_id)] = trace.get_current_span().get_span_context()


@pytest.fixture
def exporter(monkeypatch):
    """An SDK provider for this test only (the global one can be set once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr(seamq.observability, "tracer", provider.get_tracer("seamq"))
    yield exporter
    provider.shutdown()


async def test_the_handler_continues_the_producers_trace_through_the_relay(dsn, nats_server, nc, topo, exporter):
    producer = trace.get_tracer("shop")
    with producer.start_as_current_span("place vibe") as span, psycopg.connect(dsn) as conn:
        traced = vibe("v-traced")
        outbox.add(conn, traced)
    untraced = vibe("v-plain")  # written outside any span: a trace of its own, named by its id
    with psycopg.connect(dsn) as conn:
        outbox.add(conn, untraced)
    producer_ctx = span.get_span_context()

    stop = asyncio.Event()
    settings = Settings(database_url=dsn, nats=NatsSettings(url=nats_server.url), relay=RelaySettings())
    relay = asyncio.create_task(run_relay(settings, topo, stop))
    registry = Registry(routes=(Route("vibe_created", 1, remember_span),))
    try:
        async with consuming(dsn, nats_server.url, topo, registry):
            await wait_for(lambda: len(seen) >= 2 and {str(traced.id), str(untraced.id)} <= set(seen),
                           what="both events handled")
    finally:
        stop.set()
        await asyncio.wait_for(relay, 30)

    spans = {s.name: s for s in exporter.get_finished_spans()
             if s.attributes.get("messaging.message.id") == str(traced.id) or s.name.startswith("handle")}
    publish = spans["publish vibespro.event.vibe_created.v1"]
    assert publish.kind == trace.SpanKind.PRODUCER
    assert publish.context.trace_id == producer_ctx.trace_id
    assert publish.parent.span_id == producer_ctx.span_id
    handling = [s for s in exporter.get_finished_spans()
                if s.kind == trace.SpanKind.CONSUMER and s.context.trace_id == producer_ctx.trace_id]
    assert len(handling) == 1 and handling[0].parent.span_id == publish.context.span_id
    # The handler ran inside the handling span, in the producer's trace.
    assert seen[str(traced.id)].trace_id == producer_ctx.trace_id
    assert seen[str(traced.id)].span_id == handling[0].context.span_id
    # Without a producer span the trace id is the event's id, as before.
    assert seen[str(untraced.id)].trace_id == int(traceparent_for(untraced.id).split("-")[1], 16)
