"""The relay (CMD-050): outbox rows -> JetStream, each exactly once in the stream.

Loop: claim a batch (bucket locks keep per-aggregate order across relays),
publish it pipelined with `Nats-Msg-Id` = outbox id (an aggregate's rows
stored in order or not at all: OutMessage.key), mark what JetStream
acknowledged, commit. A crash anywhere before the commit leaves the rows
unpublished; the next claim publishes them again and JetStream drops the
duplicates by id. Published rows are kept (see `seamq outbox purge`) longer
than the reconcile interval, so a broker that loses acknowledged writes can
be repaired from the outbox.

Waking: a relay with work goes on claiming; one about to sleep registers
with `OutboxWakeup`, so producers NOTIFY from then on, and claims once more
(docs/operations.md, "How the relay wakes up"). While it cannot register (a
producer that skipped its NOTIFY is still open) it polls, from 2 ms doubling
to 100 ms; registered, it polls every `poll_interval` as a fallback. When
NATS is unreachable it waits with capped backoff instead of burning
attempts; when PostgreSQL is, it reconnects. A row written with a later
`deliver_at` is held in the outbox; each claim says when the next one is due,
and the relay releases it then (waking for it when idle) and publishes it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from seamq.backoff import NO_JITTER, Away, Backoff
from seamq.health import Beat, Health
from seamq.model import SeamqError, describe, message_headers
from seamq.observability import (
    OUTBOX_BACKLOG, OUTBOX_OLDEST_SECONDS, OUTBOX_PARKED, RELAY_BATCH_SECONDS, RELAY_FAILED, RELAY_PUBLISHED, end_publish_spans,
    log, start_publish_spans,
)
from seamq.ports import JetStreamPublisher, OutboxRepository, OutboxRow, OutboxWakeup, OutMessage, PubResult, Sleep
from seamq.settings import RelaySettings
from seamq.stopping import sleep_unless_stopped
from seamq.topology import Topology

class Relay:
    def __init__(
        self, outbox: OutboxRepository, publisher: JetStreamPublisher, wakeup: OutboxWakeup, topology: Topology,
        settings: RelaySettings | None = None, *, max_payload: int = 1024 * 1024, connected=lambda: True,
        health: Health | None = None,
    ) -> None:
        """`max_payload`: the server's; a larger row is unpublishable, said so on the row."""
        self.health = health or Health()
        self.outbox = outbox
        self.publisher = publisher
        self.topology = topology
        self.config = settings or RelaySettings()
        self.backoff = Backoff(1.0, self.config.max_backoff)  # a row the broker refused waits by it
        self.max_payload = max_payload
        self._connected = connected
        self.wakeup = wakeup
        self.wake = self.wakeup.wake  # NOTIFY, or a loop that found more work than it took
        self.published_total = 0
        # When the next delayed row is due (monotonic), as the last claim said (rows that fell due while
        # no relay ran: the first claim says "now"). Nothing is released unless one is: an UPDATE that
        # finds no row would still take its table lock.
        self.due_at: float | None = None
        self._reported: set[str] = set()  # contexts whose gauges were set

    def _message(self, row: OutboxRow) -> OutMessage | str:
        """The message for a row, or why it cannot be published."""
        subject, stream, problem = self._subject(row.context, row.event_type, row.event_version, row.bucket)
        if problem:
            return problem
        payload = row.payload.encode()
        if len(payload) > self.max_payload:
            return f"payload of {len(payload)} bytes exceeds the server's max_payload {self.max_payload}"
        return OutMessage(subject, payload, message_headers(row, row.traceparent), stream,
                          key=(row.aggregate_type, row.aggregate_id))

    @functools.lru_cache(maxsize=16384)  # noqa: B019  # one relay per process: its cache lives as long
    def _subject(self, context: str, event_type: str, version: int, bucket: int) -> tuple[str | None, ...]:
        """(subject, stream, None) or (None, None, why not); cached, as there are few distinct ones."""
        try:
            return *self.topology.destination(context, event_type, version, bucket), None
        except SeamqError as exc:
            return None, None, exc.message

    async def run_once(self) -> _Batch:
        """One batch: claim, publish, mark, commit."""
        started = time.perf_counter()
        if self.due_at is not None and time.monotonic() >= self.due_at:
            await self.outbox.release_due()
        async with self.outbox.claim(self.config.batch_size) as batch:
            self.due_at = None if batch.next_due is None else time.monotonic() + batch.next_due
            if not batch.rows:
                return _Batch(0, batch.more, False)
            marks = _Marks(backoff=self.backoff)
            sendable = []
            held = set()  # aggregates with an unpublishable row: their later rows wait, in order
            for row in batch.rows:
                aggregate = (row.aggregate_type, row.aggregate_id)
                if aggregate in held:
                    continue
                built = self._message(row)
                if isinstance(built, str):
                    marks.invalid(row, built)
                    held.add(aggregate)
                else:
                    sendable.append((row, built))
            messages = [m for _, m in sendable]
            spans, results = start_publish_spans(messages), []
            try:
                results = await self.publisher.publish_many(messages) if sendable else []
            finally:
                end_publish_spans(spans, results)
            for (row, _), result in zip(sendable, results):
                marks.result(row, result)
            await batch.mark_published(marks.ok_ids, marks.ok_seqs)
            await batch.mark_failed(marks.fail_ids, marks.fail_errors, marks.fail_delays, marks.fail_park)
        self.published_total += len(marks.ok_ids)
        for context, count in marks.per_context.items():
            RELAY_PUBLISHED.labels(context).inc(count)
        RELAY_BATCH_SECONDS.observe(time.perf_counter() - started)
        return _Batch(len(batch.rows), batch.more or marks.held > 0, marks.transport_failed)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: batches back to back while there is work, then wait."""
        self.health.started = True
        await asyncio.gather(*(self._loop(stop, self.health.beat(f"relay_loop_{i}"), reports=(i == 0))
                               for i in range(self.config.loops)))

    async def _loop(self, stop: asyncio.Event, beat: Beat, reports: bool) -> None:
        away = Away(Backoff(base=0.1, cap=self.config.max_backoff, spread=NO_JITTER))
        last_backlog = 0.0
        uncovered = _FIRST_POLL
        while not stop.is_set():
            beat.turn()  # until it waits: a claim, a publish, a mark that hangs shows in /healthz
            if not self._connected():  # nats-py is reconnecting: look again soon
                await self._sleep(stop, beat, away, "nats_unavailable", NATS_AWAY_LOOK)
                continue
            try:
                done = await self.run_once()
            except Exception as exc:  # keep the worker alive: back off and try again
                if self.outbox.unavailable(exc):
                    log.warning("relay_database_error", error=str(exc))
                    await self._sleep(stop, beat, away, "database_unavailable")
                else:
                    log.exception("relay_batch_failed", error=str(exc))
                    await self._sleep(stop, beat, away, "unexpected_error")
                continue
            if done.transport_failed:
                await self._sleep(stop, beat, away, "nats_publish_failed", NATS_AWAY_LOOK)
                continue
            away.back()
            if reports and time.monotonic() - last_backlog > self.config.backlog_interval:
                last_backlog = time.monotonic()
                await self._report_backlog()
            if done.claimed:
                uncovered = _FIRST_POLL
                await self.wakeup.awake()  # busy: producers may stop notifying
                if done.claimed == self.config.batch_size or done.more:
                    self.wake.set()  # a backlog: go straight on, and leave a wake-up for an idle loop
                    continue
            elif done.more:  # what is left sits in buckets other loops hold
                await self._wait_for_work(stop, beat, 0.05)
                continue
            sleep = await self.wakeup.asleep()
            if sleep is Sleep.REGISTERED:
                continue  # once more: rows whose producers skipped their NOTIFY are visible now
            if sleep is Sleep.UNCOVERED:
                await self._wait_for_work(stop, beat, uncovered)
                uncovered = min(self.config.poll_interval, _LAST_POLL, uncovered * 2)
            else:
                await self._wait_for_work(stop, beat, self.config.poll_interval)

    async def _sleep(self, stop: asyncio.Event, beat: Beat, away: Away, why: str, most: float | None = None) -> None:
        """Wait, twice as long as the last time up to `most` (max_backoff), said while it grows."""
        beat.rest()
        before = away.waited
        wait = away.next(most)
        if wait != before:
            log.info("relay_backing_off", reason=why, seconds=wait)
        await sleep_unless_stopped(stop, wait)

    async def _wait_for_work(self, stop: asyncio.Event, beat: Beat, timeout: float) -> None:
        """Until this loop takes a wake-up, the timeout, or stop.

        A wake-up (NOTIFY, or a loop that left work behind) stays set until a
        loop takes it here, so one that comes during a batch is not lost. It
        wakes every idle loop; the first to run clears it, the rest wait on.
        """
        beat.rest()
        deadline = time.monotonic() + timeout
        if self.due_at is not None:  # a delayed row falls due sooner: be there (within ms) to publish it
            deadline = min(deadline, self.due_at)
        while not stop.is_set():
            if self.wake.is_set():
                self.wake.clear()
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()

    async def _report_backlog(self) -> None:
        try:
            rows = await self.outbox.backlog()
        except Exception as exc:  # a gauge can wait for the next round
            log.info("relay_backlog_unavailable", error=describe(exc))
            return
        now = time.time()
        # Every context reported before too: one whose rows are gone (parked, dropped) falls to 0.
        self._reported |= set(self.topology.contexts)
        for ctx in self._reported:
            OUTBOX_BACKLOG.labels(ctx).set(0)
            OUTBOX_OLDEST_SECONDS.labels(ctx).set(0)
            OUTBOX_PARKED.labels(ctx).set(0)
        for row in rows:
            self._reported.add(row.context)
            OUTBOX_BACKLOG.labels(row.context).set(row.count)
            OUTBOX_PARKED.labels(row.context).set(row.parked)
            if row.oldest_at:  # None when every row waits for its deliver_at
                OUTBOX_OLDEST_SECONDS.labels(row.context).set(max(0.0, now - row.oldest_at.timestamp()))


# Seconds between polls while a producer that skipped its NOTIFY is open: doubling,
# so one left open for minutes costs ten empty claims a second.
_FIRST_POLL, _LAST_POLL = 0.002, 0.1
# The longest wait after NATS went away or a publish failed for the broker's sake: nats-py
# reconnects on its own, and a wait grown past it was most of a 28 s stop when a node was cut off.
NATS_AWAY_LOOK = 1.0


class _Batch(NamedTuple):
    claimed: int
    more: bool  # pending work this claim left (to other loops, or for the next claim)
    transport_failed: bool  # the broker was unreachable


@dataclass
class _Marks:
    """What one batch learned, sorted into the two UPDATEs that record it."""

    ok_ids: list = field(default_factory=list)
    ok_seqs: list = field(default_factory=list)
    fail_ids: list = field(default_factory=list)
    fail_errors: list = field(default_factory=list)
    backoff: Backoff = Backoff(1.0, 30.0)  # a failed row's wait, by its attempts
    fail_delays: list = field(default_factory=list)
    fail_park: list = field(default_factory=list)
    transport_failed: bool = False
    held: int = 0
    per_context: Counter = field(default_factory=Counter)  # EVT-047-001, counted per batch

    def result(self, row: OutboxRow, result: PubResult) -> None:
        if result.held:  # its batch stopped before it: claimed again at once, no attempt counted
            self.held += 1
            return
        if result.ok:
            self.ok_ids.append(row.id)
            self.ok_seqs.append(result.seq)
            self.per_context[row.context] += 1
            return
        transport = result.transport
        self.transport_failed |= transport
        # A broker outage is not the row's fault: no per-row backoff, the relay waits.
        self._fail(row, result.error or "unknown error", retry_later=not transport)
        RELAY_FAILED.labels(row.context, "transport" if transport else "message").inc()

    def invalid(self, row: OutboxRow, reason: str) -> None:
        """It can never be published as it is: parked for a person (`seamq outbox parked`), logged once."""
        self._fail(row, reason, retry_later=False, park=True)
        RELAY_FAILED.labels(row.context, "invalid").inc()
        log.error("outbox_row_parked", outbox_id=str(row.id), context=row.context, reason=reason,
                  fix="seamq outbox parked | move | retry | drop")

    def _fail(self, row: OutboxRow, error: str, retry_later: bool, park: bool = False) -> None:
        self.fail_ids.append(row.id)
        self.fail_errors.append(error)
        self.fail_delays.append(self.backoff.delay(row.publish_attempts + 1) if retry_later else None)
        self.fail_park.append(park)
