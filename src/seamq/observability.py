"""Metrics and structured logs, named once so every worker reports alike.

Prometheus metrics are process-wide; seamq.http.probes serves them beside the health probes.
Logs are structlog JSON lines on stderr. EVT-047-001 OutboxEventPublished is
a counter plus a debug-level log event (one line per event would cost more
than publishing it).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry import context, propagate, trace
from prometheus_client import Counter, Gauge, Histogram

from seamq.redact import redact

RELAY_PUBLISHED = Counter("seamq_relay_published_total", "Outbox events published (EVT-047-001)", ["context"])
RELAY_FAILED = Counter("seamq_relay_failed_total", "Outbox publish failures", ["context", "kind"])
RELAY_BATCH_SECONDS = Histogram(
    "seamq_relay_batch_seconds", "Claim + publish + mark of one batch",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
OUTBOX_BACKLOG = Gauge("seamq_outbox_backlog", "Unpublished outbox rows (QRY-050)", ["context"])
OUTBOX_OLDEST_SECONDS = Gauge("seamq_outbox_oldest_seconds", "Age of the oldest unpublished row", ["context"])
OUTBOX_PARKED = Gauge("seamq_outbox_parked", "Outbox rows the relay can never publish as they are, set aside "
                      "for a person (seamq outbox parked)", ["context"])

CONSUMER_PROCESSED = Counter("seamq_consumer_processed_total", "Messages handled", ["consumer", "event_type"])
CONSUMER_DUPLICATES = Counter("seamq_consumer_duplicates_total", "Duplicate deliveries skipped", ["consumer"])
CONSUMER_DEAD_LETTERED = Counter("seamq_consumer_dead_lettered_total", "Messages sent to the DLQ",
                                 ["consumer", "reason"])
CONSUMER_REDELIVERIES = Counter("seamq_consumer_redeliveries_total", "Deliveries after the first", ["consumer"])
CONSUMER_RETRIES = Counter("seamq_consumer_retries_total", "Handler failures left for redelivery", ["consumer"])
CONSUMER_PENDING = Gauge("seamq_consumer_pending", "Messages not yet delivered to the consumer, as of its last fetch",
                         ["consumer"])
CONSUMER_HANDLER_SECONDS = Histogram(
    "seamq_consumer_handler_seconds", "Handler call duration", ["consumer"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CONSUMER_E2E_SECONDS = Histogram(
    "seamq_consumer_end_to_end_seconds", "occurred_at (a delayed event: deliver_at) -> handled", ["consumer"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
)


def configure_logging(level: str = "info", *, json: bool = True, file=None) -> None:
    """JSON lines to stderr, or to `file` (seamq dev keeps the terminal for its dashboard)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redacted,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=file or sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries log through the standard library (psycopg_pool's connection errors quote
    # what libpq said): one handler, warnings and up, through the same redaction.
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not isinstance(h, _RedactingHandler)]
    handler = _RedactingHandler(file or sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(max(numeric, logging.WARNING))


class _RedactingHandler(logging.StreamHandler):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _redacted(logger, method, event_dict: dict) -> dict:
    """structlog processor: no secret in any field (see seamq.redact)."""
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = redact(value)
        elif not isinstance(value, (int, float, bool, type(None))):
            event_dict[key] = redact(str(value))
    return event_dict


log = structlog.get_logger("seamq")
tracer = trace.get_tracer("seamq")


class ConsumerMetrics:
    """Label children resolved once: labels() per message costs more than the work it counts."""

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.handler_seconds = CONSUMER_HANDLER_SECONDS.labels(consumer)
        self.e2e_seconds = CONSUMER_E2E_SECONDS.labels(consumer)
        self.retries = CONSUMER_RETRIES.labels(consumer)
        self.duplicates = CONSUMER_DUPLICATES.labels(consumer)
        self.redeliveries = CONSUMER_REDELIVERIES.labels(consumer)
        self.pending = CONSUMER_PENDING.labels(consumer)
        self._processed: dict[str, Any] = {}
        self._dead_lettered: dict[str, Any] = {}

    def dead_lettered(self, reason: str):
        child = self._dead_lettered.get(reason)
        if child is None:
            child = self._dead_lettered[reason] = CONSUMER_DEAD_LETTERED.labels(self.consumer, reason)
        return child

    def processed(self, event_type: str):
        child = self._processed.get(event_type)
        if child is None:
            child = self._processed[event_type] = CONSUMER_PROCESSED.labels(self.consumer, event_type)
        return child


# W3C trace-context version 00, as the relay writes it (model.traceparent_for).
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_PASSABLE = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")  # any version's first fields
_DEFAULT_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})
_seen_default: list[object] = [None]  # the configured propagator last seen to be the default ones


def _default_propagators(textmap) -> bool:
    if textmap is _seen_default[0]:
        return True
    if frozenset(textmap.fields) == _DEFAULT_FIELDS:
        _seen_default[0] = textmap
        return True
    return False


def remote_context(headers: Mapping[str, str]) -> context.Context:
    """The context a message's headers carry: `propagate.extract`, with its common case done directly.

    Extracting costs about 3.5 us a message through the composite propagator
    and 1.5 us this way, a measurable share of the consumer's CPU. The direct
    way applies only to what it reads exactly as the default propagators
    would (a plain version-00 traceparent, no tracestate or baggage, the
    default propagators configured); anything else goes to `propagate`.
    """
    match = _TRACEPARENT.fullmatch(headers.get("traceparent", ""))
    if (match is None or "tracestate" in headers or "baggage" in headers
            or not _default_propagators(propagate.get_global_textmap())):
        return propagate.extract(headers)
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return propagate.extract(headers)
    span = trace.NonRecordingSpan(trace.SpanContext(trace_id, span_id, is_remote=True,
                                                    trace_flags=trace.TraceFlags(int(match[3], 16))))
    return trace.set_span_in_context(span)


class continue_trace:
    """Continue the message's trace around the handler (`with continue_trace(...) as traceparent`);
    gives the traceparent to pass on, or None when the message's is not of W3C's shape (it came with
    the message: it is ignored, as the standard says, not written into a request).

    With no OpenTelemetry SDK configured there is nothing to record, so the
    incoming traceparent is passed through as is (and the per-message cost of
    starting a span and injecting is skipped); `here` False (an HTTP handler:
    no code of this process runs under the trace) skips making it current too.
    A class, not a generator: it runs once per message.
    """

    __slots__ = ("subject", "headers", "here", "_token", "_span")

    def __init__(self, subject: str, headers: Mapping[str, str], *, here: bool = True) -> None:
        self.subject, self.headers, self.here = subject, headers, here
        self._token = self._span = None

    def __enter__(self) -> str | None:
        passed = self.headers.get("traceparent")
        if passed is not None and _PASSABLE.fullmatch(passed) is None:
            passed = None
        if not recording():
            if self.here:  # handlers still see the trace as current
                self._token = context.attach(remote_context(self.headers))
            return passed
        self._span = tracer.start_as_current_span(f"handle {self.subject}", context=remote_context(self.headers),
                                                  kind=trace.SpanKind.CONSUMER)
        self._span.__enter__()
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier.get("traceparent") or passed

    def __exit__(self, *exc_info) -> None:
        if self._span is not None:
            self._span.__exit__(*exc_info)
        elif self._token is not None:
            context.detach(self._token)


def recording() -> bool:
    """Whether an OpenTelemetry SDK is configured: without one, spans would record nothing."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def start_publish_spans(messages: list) -> list[trace.Span]:
    """The relay's PRODUCER span per message, children of the writer's span (the row's traceparent);
    each message's traceparent becomes its span's, so the handler's span is the publish's child."""
    if not recording():
        return []
    spans = []
    for msg in messages:
        span = tracer.start_span(f"publish {msg.subject}", context=remote_context(msg.headers),
                                 kind=trace.SpanKind.PRODUCER, attributes={
                                     "messaging.system": "nats", "messaging.destination.name": msg.subject,
                                     "messaging.message.id": msg.headers.get("Nats-Msg-Id", "")})
        propagate.inject(msg.headers, context=trace.set_span_in_context(span))
        spans.append(span)
    return spans


def end_publish_spans(spans: list[trace.Span], results: list) -> None:
    """`results` is shorter than `spans` when the publish raised: those messages were not published."""
    for i, span in enumerate(spans):
        error = results[i].error if i < len(results) and not results[i].ok else None
        if i >= len(results) or error:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error or "not published"))
        span.end()
