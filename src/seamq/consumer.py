"""The inbox consumer (CMD-051, CMD-052): JetStream -> inbox -> handler -> ACK | redeliver | DLQ.

Fetched messages go to lanes: long-lived workers with a FIFO queue each,
chosen by aggregate when ordered, so one aggregate's messages run one after
another while other aggregates run concurrently, and nothing waits for an
unrelated batch to finish. A lane takes what has queued up and handles it in
one PostgreSQL transaction:

    record in inbox -> handlers -> dead letters -> marks -> COMMIT
    then ACK what is done, NAK (with backoff) what must be retried.

New messages are recorded already marked processed, and the few that were
not are put back before the commit: one write per message instead of two,
since nobody sees the mark before the commit anyway.

Because the inbox rows stay locked until the commit, a concurrent
redelivery of the same message waits, then sees it processed, and an
in-process handler's writes commit atomically with the "processed" mark:
exactly-once side effects. A crash before the commit rolls everything back
and JetStream redelivers.

ACK rules (POL-047-005..007): done (200/409) -> mark processed, ACK; poison
(422) -> DLQ, mark dead_lettered, ACK; retry (5xx, timeout) -> record the
error, NAK with exponential backoff + jitter, and at max_deliver route to the
DLQ instead of letting JetStream stop delivering in silence. Malformed
messages go to the DLQ with a precise reason and are ACKed.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from nats.aio.msg import Msg

from seamq.envelope import (
    REPLAY_ATTEMPT, Envelope, HandlerResult, Outcome, Reason, Rejected, dead_letter_body, parse_message,
)
from seamq.holds import Block, Holds
from seamq.model import EventSubject, Header, SeamqError
from seamq.observability import (
    CONSUMER_DEAD_LETTERED, CONSUMER_DUPLICATES, CONSUMER_REDELIVERIES, CONSUMER_RETRIES, ConsumerMetrics,
    continue_trace, log,
)
from seamq.ports import Claim, InboxItem, InboxRepository, JetStreamPublisher, OutMessage
from seamq.topology import ConsumerSpec


class Handler(Protocol):
    transactional: bool

    async def __call__(self, envelope: Envelope, conn: Any, traceparent: str | None = None) -> HandlerResult: ...


HandlerLookup = Callable[[str, int], "Handler | None"]


@dataclass
class ConsumerConfig:
    batch_size: int = 50
    fetch_timeout: float = 1.0
    concurrency: int = 4
    ordered: bool = True
    nak_base: float = 1.0
    nak_max: float = 60.0
    max_payload: int = 1024 * 1024
    lane_batch: int = 100  # most messages one lane transaction takes


@dataclass
class _Work:
    """One fetched message and, as the lane goes, what to do with it."""

    msg: Msg
    envelope: Envelope | None  # parsed fine (it may still have no handler)
    rejected: Rejected | None  # why it can never be handled
    handler: Handler | None = None
    ack: bool = False
    nak_delay: float | None = None
    dead_letter: tuple[Reason, str] | None = None
    error: str | None = None
    attempts: int = 0
    http_result: HandlerResult | None = None  # kept across a lane's redo: never call HTTP twice

    def reset(self) -> None:
        self.ack, self.nak_delay, self.dead_letter, self.error, self.attempts = False, None, None, None, 0

    @property
    def message_id(self) -> uuid.UUID | None:
        return self.envelope.message_id if self.envelope else self.rejected.message_id

    @property
    def aggregate(self) -> str:
        if self.envelope:
            return f"{self.envelope.aggregate_type}/{self.envelope.aggregate_id}"
        return str(self.message_id)


class _Undo(Exception):
    """Rolls back a handler's savepoint when its outcome is not success."""


class _Redo(Exception):
    """An in-process handler failed on the fast path: redo the lane with savepoints."""


class InboxConsumer:
    def __init__(
        self, spec: ConsumerSpec, source, pool, inbox: InboxRepository, dlq: JetStreamPublisher,
        handlers: HandlerLookup, config: ConsumerConfig | None = None,
    ) -> None:
        """`pool` None means no database: the at-least-once mode, with a NoInbox."""
        self.spec = spec
        self.source = source
        self.pool = pool
        self.dlq = dlq
        self.handlers = handlers
        self.config = config or ConsumerConfig()
        self.inbox = inbox
        self._metrics = ConsumerMetrics(spec.name)
        self._holds = Holds()  # ordered mode: aggregates waiting behind a failed message

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and dispatch until `stop`; then stop asking for more, let the lanes
        finish what was already delivered to us, ACK it, and return."""
        batch = max(1, min(self.config.batch_size, self.spec.max_ack_pending))
        queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(self.config.concurrency)]
        lanes = [asyncio.create_task(self._lane(queue)) for queue in queues]
        try:
            while True:
                if stop.is_set():
                    self.source.stop_requesting()
                    if self.source.drained:
                        return
                try:
                    messages = await self.source.fetch(batch, self.config.fetch_timeout)
                except Exception as exc:  # broker away: the client reconnects, we wait
                    log.warning("consumer_fetch_failed", consumer=self.spec.name, error=str(exc))
                    await _sleep_unless(stop, 1.0)
                    continue
                for i, msg in enumerate(messages):
                    item = self._prepare(msg)
                    queues[self._lane_of(item, i) % len(queues)].put_nowait(item)
        finally:
            for queue in queues:
                queue.put_nowait(None)  # after what is queued: finish it, then stop
            await asyncio.gather(*lanes)

    def _prepare(self, msg: Msg) -> _Work:
        if msg.metadata.num_delivered > 1:
            CONSUMER_REDELIVERIES.labels(self.spec.name).inc()
        if len(msg.data) > self.config.max_payload:
            oversize = Rejected(Reason.OVERSIZE, f"payload of {len(msg.data)} bytes exceeds {self.config.max_payload}")
            return _Work(msg, None, oversize)
        parsed = parse_message(msg.subject, msg.headers, msg.data)
        if isinstance(parsed, Rejected):
            return _Work(msg, None, parsed)
        work = _Work(msg, parsed, None, self.handlers(parsed.event_type, parsed.event_version))
        if work.handler is None:
            work.rejected = Rejected(
                Reason.NO_HANDLER, f"no handler for {parsed.event_type}.v{parsed.event_version}", parsed.message_id)
        return work

    def _lane_of(self, item: _Work, i: int) -> int:
        # Ordered: an aggregate always lands in one lane, handled in stream order.
        # Copies of one message id share a lane either way, so they cannot race.
        if self.config.ordered:
            return hash(item.aggregate)
        return hash(item.message_id) if item.message_id else i

    async def _lane(self, queue: asyncio.Queue) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            items = [item]
            while not queue.empty() and len(items) < self.config.lane_batch:
                nxt = queue.get_nowait()
                if nxt is None:
                    queue.put_nowait(None)  # stop after this transaction
                    break
                items.append(nxt)
            await self._run_lane(items)

    async def _run_lane(self, items: list[_Work]) -> None:
        """Fast path: the lane's handlers run without savepoints (two round trips per
        message saved). If an in-process handler fails, its writes cannot be undone
        alone, so the whole lane rolls back and runs again with a savepoint each."""
        try:
            try:
                await self._attempt(items, careful=False)
            except _Redo:
                await self._attempt(items, careful=True)
        except Exception as exc:  # database trouble or a deadlock: nothing committed, all come back
            log.warning("consumer_lane_failed", consumer=self.spec.name, error=f"{type(exc).__name__}: {exc}")
            for item in items:
                item.ack, item.nak_delay = False, self._backoff(item.msg)
        else:
            self._update_blocks(items)
        await self._settle(items)

    async def _attempt(self, items: list[_Work], careful: bool) -> None:
        for item in items:
            item.reset()
        if self.pool is None:
            await self._handle_lane(None, items, careful=False)
            return
        async with self.pool.connection() as conn, conn.transaction():
            await self._handle_lane(conn, items, careful)

    async def _handle_lane(self, conn, items: list[_Work], careful: bool) -> None:
        claims = await self.inbox.claim(conn, _inbox_items(items))
        done, failed, held, first_copy, copies = [], [], {}, {}, []
        for item in items:
            message_id = item.message_id
            if message_id is not None and message_id in first_copy:
                copies.append((item, first_copy[message_id]))  # settled like the first, below
                continue
            if message_id is not None:
                first_copy[message_id] = item
            claim, item.attempts = claims.get(message_id, (Claim.NEW, 1))
            if claim == Claim.DUPLICATE:
                item.ack = True
                CONSUMER_DUPLICATES.labels(self.spec.name).inc()
                continue
            if item.rejected:
                item.dead_letter = (item.rejected.reason, item.rejected.detail)
                continue
            if self.config.ordered:  # behind its own aggregate's failed message?
                meta = item.msg.metadata
                hold = self._holds.delay(item.aggregate, message_id, meta.sequence.stream,
                                         meta.num_delivered >= self.spec.max_deliver, held)
                if hold is not None:
                    item.nak_delay = hold
                    continue
            result = await self._call(conn, item, careful)
            if result.done:
                item.ack = True
                done.append(message_id)
            elif result.outcome == Outcome.POISON:
                item.dead_letter = (result.reason or Reason.HANDLER_REJECTED, result.detail or "handler rejected it")
            elif item.msg.metadata.num_delivered >= self.spec.max_deliver:
                item.dead_letter = (Reason.MAX_DELIVER, f"{item.msg.metadata.num_delivered} deliveries; last: "
                                                        f"{result.detail}")
            else:
                item.error, item.nak_delay = result.detail or "retry", self._backoff(item.msg)
                failed.append(item)
                held.setdefault(item.aggregate, Block.retry_in(
                    message_id, item.msg.metadata.sequence.stream, item.nak_delay))
                CONSUMER_RETRIES.labels(self.spec.name).inc()
        # New rows were recorded as processed (see PgInbox.claim); put back those that were not.
        done_ids = set(done)
        new = {message_id for message_id, (claim, _) in claims.items() if claim == Claim.NEW}
        await self.inbox.not_processed(conn, [message_id for message_id in new if message_id not in done_ids])
        await self._dead_letter(conn, [i for i in items if i.dead_letter and not i.ack], failed)
        duplicates = []
        for item, first in copies:
            item.ack, item.nak_delay = first.ack, first.nak_delay
            if first.ack and not first.dead_letter:
                duplicates.append(item.message_id)
                CONSUMER_DUPLICATES.labels(self.spec.name).inc()
        await self.inbox.processed(conn, [message_id for message_id in done if message_id not in new])
        await self.inbox.duplicate(conn, duplicates)
        await self.inbox.failed(conn, [i.message_id for i in failed], [i.error for i in failed])

    def _update_blocks(self, items: list[_Work]) -> None:
        """After a commit (see seamq.holds)."""
        if not self.config.ordered:
            return
        for item in items:
            if item.message_id is not None:
                failed = item.error is not None and item.nak_delay is not None
                self._holds.record(item.aggregate, item.message_id, item.msg.metadata.sequence.stream,
                                   retry_in=item.nak_delay if failed else None, handled=item.ack)
        self._holds.forget_lapsed()

    async def _call(self, conn, item: _Work, careful: bool) -> HandlerResult:
        envelope = item.envelope
        headers = item.msg.headers or {}
        started = time.perf_counter()
        with continue_trace(envelope.subject, headers) as traceparent:
            if not item.handler.transactional:
                if item.http_result is None:
                    item.http_result = await item.handler(envelope, conn, traceparent)
                result = item.http_result
            elif conn is None:  # no inbox, no transaction: nothing to undo
                result = await item.handler(envelope, conn, traceparent)
            elif not careful:
                result = await item.handler(envelope, conn, traceparent)
                if not result.done:
                    raise _Redo
            else:
                try:
                    async with conn.transaction():  # a savepoint: a failed handler's writes vanish
                        result = await item.handler(envelope, conn, traceparent)
                        if not result.done:
                            raise _Undo
                except _Undo:
                    pass
        metrics = self._metrics
        metrics.handler_seconds.observe(time.perf_counter() - started)
        if result.done:
            metrics.processed(envelope.event_type).inc()
            metrics.e2e_seconds.observe(max(0.0, (datetime.now(timezone.utc) - envelope.occurred_at).total_seconds()))
        return result

    async def _dead_letter(self, conn, items: list[_Work], failed: list[_Work]) -> None:
        """Publish EVT-047-002 for each, then mark the inbox; a failed publish becomes a retry."""
        if not items:
            return
        results = await self.dlq.publish_many([self._dlq_message(i) for i in items])
        marked = []
        for item, result in zip(items, results):
            reason, detail = item.dead_letter
            if result.ok:
                item.ack = True
                marked.append((item, result.seq))
                CONSUMER_DEAD_LETTERED.labels(self.spec.name, reason.value).inc()
                log.warning("message_dead_lettered", consumer=self.spec.name, message_id=str(item.message_id),
                            subject=item.msg.subject, reason=reason.value, detail=detail[:300])
            else:
                item.dead_letter, item.error = None, f"DLQ publish failed ({result.error}); was: {reason.value}"
                item.nak_delay = self._backoff(item.msg)
                if item.message_id:
                    failed.append(item)
        with_ids = [(i, seq) for i, seq in marked if i.message_id is not None]
        await self.inbox.dead_lettered(
            conn, [i.message_id for i, _ in with_ids], [i.dead_letter[0].value for i, _ in with_ids],
            [i.dead_letter[1] for i, _ in with_ids], [self._dlq_subject(i) for i, _ in with_ids],
            [seq for _, seq in with_ids],
        )

    def _dlq_subject(self, item: _Work) -> str:
        """`{target}.dlq.{source}.{event}.v{n}`: the consumer's context owns its failures."""
        prefix = f"{self.spec.target}.dlq.{self.spec.source}"
        try:
            subject = EventSubject.parse(item.msg.subject)
        except SeamqError:
            return f"{prefix}._invalid"
        return f"{prefix}.{subject.name}.v{subject.version}"

    def _dlq_message(self, item: _Work) -> OutMessage:
        reason, detail = item.dead_letter
        meta = item.msg.metadata
        replay = (item.msg.headers or {}).get(REPLAY_ATTEMPT, "0")
        key = str(item.message_id) if item.message_id else f"{meta.stream}:{meta.sequence.stream}"
        body = dead_letter_body(
            message_id=item.message_id, original_subject=item.msg.subject, reason=reason, detail=detail,
            attempts=max(item.attempts, meta.num_delivered), consumer=self.spec.name,
            headers=item.msg.headers, data=item.msg.data, stream_seq=meta.sequence.stream,
        )
        # One dead letter per message and replay round, even if we crash and redo this (CMD-052).
        headers = {Header.MSG_ID: f"dlq:{self.spec.name}:{key}:{replay}", "Seamq-Dlq-Reason": reason.value}
        return OutMessage(self._dlq_subject(item), body, headers)

    def _backoff(self, msg: Msg) -> float:
        """Exponential in the delivery count, with equal jitter."""
        n = max(1, msg.metadata.num_delivered)
        delay = min(self.config.nak_max, self.config.nak_base * 2 ** (n - 1))
        return delay / 2 + random.uniform(0, delay / 2)

    async def _settle(self, items: list[_Work]) -> None:
        for item in items:
            try:
                if item.ack:
                    await item.msg.ack()
                else:
                    await item.msg.nak(delay=item.nak_delay)
            except Exception as exc:  # lost ack: redelivered, then skipped as a duplicate
                log.info("consumer_ack_failed", consumer=self.spec.name, error=str(exc))


def _inbox_items(items: list[_Work]) -> list[InboxItem]:
    seen, out = set(), []
    for item in items:
        message_id = item.message_id
        if message_id is None or message_id in seen:
            continue
        seen.add(message_id)
        env = item.envelope
        out.append(InboxItem(
            message_id=message_id, subject=item.msg.subject,
            event_type=env.event_type if env else None, event_version=env.event_version if env else None,
            occurred_at=env.occurred_at if env else None, replay=bool(env and env.replay_attempt),
        ))
    return out


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass
