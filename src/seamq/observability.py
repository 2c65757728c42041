"""Metrics and structured logs, named once so every worker reports alike.

Prometheus metrics are process-wide; `serve_metrics(port)` exposes them.
Logs are structlog JSON lines on stderr. EVT-047-001 OutboxEventPublished is
a counter plus a debug-level log event (one line per event would cost more
than publishing it).
"""

from __future__ import annotations

import logging
import sys

import structlog
from prometheus_client import Counter, Gauge, Histogram, start_http_server

RELAY_PUBLISHED = Counter("seamq_relay_published_total", "Outbox events published (EVT-047-001)", ["context"])
RELAY_FAILED = Counter("seamq_relay_failed_total", "Outbox publish failures", ["context", "kind"])
RELAY_BATCH_SECONDS = Histogram(
    "seamq_relay_batch_seconds", "Claim + publish + mark of one batch",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
OUTBOX_BACKLOG = Gauge("seamq_outbox_backlog", "Unpublished outbox rows (QRY-050)", ["context"])
OUTBOX_OLDEST_SECONDS = Gauge("seamq_outbox_oldest_seconds", "Age of the oldest unpublished row", ["context"])

CONSUMER_PROCESSED = Counter("seamq_consumer_processed_total", "Messages handled", ["consumer", "event_type"])
CONSUMER_DUPLICATES = Counter("seamq_consumer_duplicates_total", "Duplicate deliveries skipped", ["consumer"])
CONSUMER_DEAD_LETTERED = Counter("seamq_consumer_dead_lettered_total", "Messages sent to the DLQ",
                                 ["consumer", "reason"])
CONSUMER_REDELIVERIES = Counter("seamq_consumer_redeliveries_total", "Deliveries after the first", ["consumer"])
CONSUMER_RETRIES = Counter("seamq_consumer_retries_total", "Handler failures left for redelivery", ["consumer"])
CONSUMER_HANDLER_SECONDS = Histogram(
    "seamq_consumer_handler_seconds", "Handler call duration", ["consumer"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CONSUMER_E2E_SECONDS = Histogram(
    "seamq_consumer_end_to_end_seconds", "occurred_at -> handled", ["consumer"],
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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=file or sys.stderr),
        cache_logger_on_first_use=False,
    )


def serve_metrics(port: int | None) -> None:
    if port:
        start_http_server(port, addr="127.0.0.1")


log = structlog.get_logger("seamq")
