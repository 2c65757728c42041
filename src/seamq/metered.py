"""The consumer's metrics as middleware: a wrapper around its lane and one around each handler.

The lane decides and settles; it counts nothing. What it made of each message
is counted here once the lane has settled it (FastStream's middleware,
Watermill's `func(HandlerFunc) HandlerFunc`), so a lane run twice (its fast
path rolled back, then redone with savepoints) or split message by message
counts each message once, by the verdict it was settled with.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from seamq.handling import Decided, Handling
from seamq.observability import ConsumerMetrics
from seamq.ports import Handler, HandlerLookup
from seamq.verdict import Ack, DeadLetter, Duplicate, Nak


class MeteredLane:
    """`lane` with its messages counted after it ran; `handlers`: the lookup, each handler timed."""

    def __init__(self, metrics: ConsumerMetrics, lane: Callable[[list[Handling]], Awaitable[list[Decided]]],
                 handlers: HandlerLookup) -> None:
        self.metrics = metrics
        self.lane = lane
        self._lookup = handlers
        self._timed: dict[int, tuple[Handler, TimedHandler]] = {}  # by the handler's identity: as many as routes

    async def __call__(self, items: list[Handling]) -> list[Decided]:
        decided = await self.lane(items)
        self.settled(decided)
        return decided

    def handlers(self, event_type: str, version: int) -> Handler | None:
        handler = self._lookup(event_type, version)
        if handler is None:
            return None
        known = self._timed.get(id(handler))
        if known is None or known[0] is not handler:
            known = self._timed[id(handler)] = (handler, TimedHandler(handler, self.metrics.handler_seconds))
        return known[1]

    def settled(self, decided: list[Decided]) -> None:
        metrics = self.metrics
        now = None
        for done in decided:
            item, verdict = done.item, done.verdict
            if item.delivered > 1:
                metrics.redeliveries.inc()
            if isinstance(verdict, Ack):
                envelope = item.envelope
                metrics.processed(envelope.event_type).inc()
                since = max(envelope.occurred_at, envelope.deliver_at or envelope.occurred_at)  # a delayed one: its time
                now = now or datetime.now(timezone.utc)
                metrics.e2e_seconds.observe(max(0.0, (now - since).total_seconds()))
            elif isinstance(verdict, Duplicate):
                metrics.duplicates.inc()
            elif isinstance(verdict, Nak):
                if verdict.error is not None and not done.copy:  # held is no retry, nor is a copy's NAK
                    metrics.retries.inc()
            elif isinstance(verdict, DeadLetter) and done.dlq_seq is not None:
                metrics.dead_lettered(verdict.reason.value).inc()


class TimedHandler:
    """A handler whose calls are timed (seamq_consumer_handler_seconds); otherwise the handler itself."""

    __slots__ = ("inner", "transactional", "seconds")

    def __init__(self, inner: Handler, seconds: Any) -> None:
        self.inner = inner
        self.transactional = inner.transactional
        self.seconds = seconds

    async def __call__(self, envelope: Any, conn: Any, traceparent: str | None = None) -> Any:
        started = time.perf_counter()
        try:
            return await self.inner(envelope, conn, traceparent)
        finally:
            self.seconds.observe(time.perf_counter() - started)
