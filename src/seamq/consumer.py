"""The inbox consumer (CMD-051, CMD-052): JetStream -> inbox -> handler -> ACK | redeliver | DLQ.

Fetched messages go to lanes: long-lived workers with a FIFO queue each,
chosen by aggregate when ordered, so one aggregate's messages run one after
another while other aggregates run concurrently, and nothing waits for an
unrelated batch to finish. A lane takes what has queued up and handles it in
one PostgreSQL transaction:

    admit (inbox) -> call (handler) -> decide (verdict) -> dead letters -> marks -> COMMIT
    then ACK or NAK each message as its verdict says.

New messages are recorded already marked processed, and the few that were
not are put back before the commit: one write per message instead of two,
since nobody sees the mark before the commit anyway.

Because the inbox rows stay locked until the commit, a concurrent
redelivery of the same message waits, then sees it processed, and an
in-process handler's writes commit atomically with the "processed" mark:
exactly-once side effects. A crash before the commit rolls everything back
and JetStream redelivers.

What happens to each message (ACK, skip as a duplicate, NAK with a delay,
dead-letter with a reason: POL-047-005..007) is decided in seamq.verdict, one
value per message, given once (`_conclude`); the lane only gathers the facts
and carries the value out, in one place (`_settle`). Metrics are a wrapper
around the lane and its handlers (seamq.metered): the lane counts nothing.

Nothing about one message may end the process or touch another message:
parsing never raises (hostile input is a dead letter with a reason), an
exception escaping a handler is a failed attempt of that message alone, and
a lane transaction that fails for another reason is split so that each
message is tried on its own; one that still fails is retried and, on its last
delivery, dead-lettered as `consumer_error`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from contextvars import ContextVar

from seamq import dead_letter
from seamq.backoff import Backoff
from seamq.envelope import HandlerResult, Outcome, Reason, Rejected, parse_message
from seamq.health import Beat, Health
from seamq.handling import Decided, Handling, Tried, attempt_number, header_uuid, inbox_items, replays_first
from seamq.holds import Holds, Pending
from seamq.metered import MeteredLane
from seamq.model import Header, describe
from seamq.observability import ConsumerMetrics, continue_trace, log
from seamq.ports import (
    Admission, DeadLettered, Delivery, DeliverySource, HandlerLookup, InboxOutcome, InboxRepository,
    JetStreamPublisher, LaneWork, StoredMessage,
)
from seamq.settings import ConsumerSettings
from seamq.stopping import sleep_unless_stopped
from seamq.topology import ConsumerSpec
from seamq.verdict import Ack, DeadLetter, Duplicate, Nak, Verdict, copy_of, dead_letter_failed, decide, lane_failed

_lane_beat: ContextVar[Beat] = ContextVar("lane_beat", default=Beat(0))  # noqa: B039  # outside a lane: nobody reads it


class InboxConsumer:
    def __init__(
        self, spec: ConsumerSpec, source: DeliverySource, inbox: InboxRepository, dlq: JetStreamPublisher,
        handlers: HandlerLookup, settings: ConsumerSettings | None = None, *, max_payload: int = 1024 * 1024,
        health: Health | None = None,
    ) -> None:
        """`max_payload`: the largest dead letter the server takes (a larger one goes by reference)."""
        self.health = health or Health()
        self.spec = spec
        self.source = source
        self.dlq = dlq
        self.config = settings or ConsumerSettings()
        self.max_payload = max_payload
        self.inbox = inbox
        self._metrics = ConsumerMetrics(spec.name)
        # Metrics wrap the lane and each handler (seamq.metered): the lane itself counts nothing.
        self._metered = MeteredLane(self._metrics, self._run_lane, handlers)
        self.handlers = self._metered.handlers
        self._holds = Holds(spec.ack_wait)  # ordered mode: aggregates waiting behind a failed message
        self.backoff = Backoff(self.config.nak_base, self.config.nak_max)

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and dispatch until `stop`; then stop asking for more, let the lanes
        finish what was already delivered to us, ACK it, and return."""
        batch = self.spec.fetch_batch(self.config.batch_size)
        queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(self.config.concurrency)]
        lanes = [asyncio.create_task(self._lane(queue, self.health.beat(f"lane_{i}")))
                 for i, queue in enumerate(queues)]
        fetching = self.health.beat("fetch")
        self.health.started = True
        try:
            while True:
                if stop.is_set():
                    self.source.stop_requesting()
                    if self.source.drained:
                        return
                try:
                    with fetching:
                        messages = await self.source.fetch(batch, self.config.fetch_timeout)
                except Exception as exc:  # broker away: the client reconnects, we wait
                    log.warning("consumer_fetch_failed", consumer=self.spec.name, error=str(exc))
                    await sleep_unless_stopped(stop, 1.0)
                    continue
                # Not reset by an empty fetch: a consumer whose lanes hang gets nothing more once
                # max_ack_pending are out, and must keep showing what waits (SeamqConsumerStalled).
                if messages:
                    self._metrics.pending.set(messages[-1].pending)
                if self.config.ordered:  # before what came after them reaches a lane
                    if (at := self.source.resumed()) is not None and (held := self._holds.resumed(at)):
                        log.info("consumer_holds_renewed", consumer=self.spec.name, aggregates=held,
                                 why="deliveries resumed after a reconnect or a time with no consumer leader")
                    self._expect(self.source.missed())
                for i, msg in enumerate(messages):
                    item = self._prepare(msg)
                    queues[self._lane_of(item, i) % len(queues)].put_nowait(item)
        finally:
            for queue in queues:
                queue.put_nowait(None)  # after what is queued: finish it, then stop
            await asyncio.gather(*lanes)

    async def handle(self, messages: list[Delivery]) -> list[Decided]:
        """One lane over `messages`, settled (ACKed or NAKed) before it returns, with each one's
        verdict: what `run` does with what it fetched, for a caller that has the deliveries in hand
        (seamq.testing runs handlers through it)."""
        return await self._metered([self._prepare(msg) for msg in messages])

    def _prepare(self, msg: Delivery) -> Handling:
        """Never raises: a message that cannot be prepared is a dead letter, not a dead consumer."""
        try:
            return self._parse(msg)
        except Exception as exc:  # a bug of ours, shown by this message: it alone pays
            message_id = header_uuid(msg)
            log.error("consumer_prepare_failed", consumer=self.spec.name, message_id=str(message_id),
                      subject=msg.subject, error=describe(exc))
            return Handling(msg, None, Rejected(Reason.CONSUMER_ERROR, f"preparing it failed: {describe(exc)}",
                                             message_id))

    def _parse(self, msg: Delivery) -> Handling:
        parsed = parse_message(msg.subject, msg.headers, msg.data, msg.delivered)
        if isinstance(parsed, Rejected):
            return Handling(msg, None, parsed)
        replay_for = msg.headers.get(Header.REPLAY_CONSUMER)  # a replay, or an edited copy, is for one consumer only
        if replay_for not in (None, self.spec.name):
            return Handling(msg, parsed, None, for_another=True)
        handler = self.handlers(parsed.event_type, parsed.event_version)
        if handler is None:
            return Handling(msg, parsed, Rejected(
                Reason.NO_HANDLER, f"no handler for {parsed.event_type}.v{parsed.event_version}", parsed.message_id))
        return Handling(msg, parsed, None, handler)

    def _expect(self, missed: list[StoredMessage]) -> None:
        """Messages sent to us and lost on the way: their aggregates wait for them (seamq.holds)."""
        for stored in missed:
            parsed = parse_message(stored.subject, stored.headers, stored.data, 1)
            if not isinstance(parsed, Rejected) and stored.headers.get(Header.REPLAY_CONSUMER) in (None, self.spec.name):
                self._holds.expect(parsed.aggregate, stored.seq)

    def _lane_of(self, item: Handling, i: int) -> int:
        # Ordered: an aggregate always lands in one lane, handled in stream order.
        # Copies of one message id share a lane either way, so they cannot race.
        if self.config.ordered:
            return hash(item.aggregate)
        return hash(item.message_id) if item.message_id else i

    async def _lane(self, queue: asyncio.Queue, beat: Beat) -> None:
        _lane_beat.set(beat)  # this lane's task only: each handler call renews it (_guarded)
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
            with beat:
                await self._metered(items)

    async def _run_lane(self, items: list[Handling], tried: Tried | None = None) -> list[Decided]:
        """Fast path: the lane's handlers run without savepoints (two round trips per
        message saved). If an in-process handler fails, its writes cannot be undone
        alone, so the whole lane rolls back and runs again with a savepoint each."""
        tried = tried or Tried()
        try:
            run = await self._attempt(items, tried, savepoints=False)
            if run is None:
                run = await self._attempt(items, tried, savepoints=True)
        except Exception as exc:  # nothing committed
            if len(items) > 1 and not self.inbox.unavailable(exc):
                # Not the database being away: maybe one message, maybe a bug. Try each on its own,
                # so that whatever it is costs only the message that causes it.
                log.error("consumer_lane_failed", consumer=self.spec.name, messages=len(items),
                          error=describe(exc), action="each message on its own")
                alone = []
                for item in items:
                    alone += await self._run_lane([item], tried)
                return alone
            run = await self._lane_failed(items, tried, exc)
        decided, pending = run
        if self.config.ordered:
            self._holds.record(pending)
        await self._settle(decided)
        return decided

    async def _lane_failed(self, items: list[Handling], tried: Tried, exc: Exception) -> tuple[list[Decided], Pending]:
        """Every message comes back, each aggregate's in stream order; a single message whose own
        transaction fails and has no delivery left is dead-lettered (`consumer_error`)."""
        error = describe(exc)
        log.warning("consumer_lane_failed", consumer=self.spec.name, error=error,
                    message_ids=[str(i.message_id) for i in items[:20]])
        pending = Pending()
        away = self.inbox.unavailable(exc)
        alone = len(items) == 1
        decided = []
        for item in items:
            attempts = tried.attempts.get(item, 0)
            if alone and not away:
                attempts = await self._count_failed(item, error, attempts)
            after = self._after(item, pending, holding=False)
            verdict = lane_failed(error=error, alone=alone, attempt=attempts, max_deliver=self.spec.max_deliver,
                                  database_away=away, backoff=self.backoff, after=after)
            # a dead letter: nothing to record it in
            decided.append(await self._conclude(item, verdict, pending, after, attempts=attempts))
        return decided, pending

    async def _count_failed(self, item: Handling, error: str, attempts: int) -> int:
        """A message whose own transaction failed: its attempt is counted apart, so that a bug it
        shows ends in the DLQ after max_deliver attempts, however often it was delivered."""
        if item.message_id is None:
            return item.delivered
        try:
            counted = await self.inbox.failed_alone(inbox_items([item])[0], error)
        except Exception as exc:  # the database went away too: count nothing, it comes back
            log.warning("consumer_attempt_not_recorded", consumer=self.spec.name, message_id=str(item.message_id),
                        error=describe(exc))
            return attempts
        return item.delivered if counted is None else counted

    async def _attempt(self, items: list[Handling], tried: Tried,
                       savepoints: bool) -> tuple[list[Decided], Pending] | None:
        """The lane in one transaction; None when an in-process handler failed on the fast path:
        then nothing of it committed, and it is to be run again with savepoints."""
        pending = Pending()
        async with self.inbox.transaction() as work:
            decided = await self._handle_lane(work, items, tried, savepoints, pending)
            if decided is None:
                work.abandon()
                return None
        return decided, pending

    async def _handle_lane(self, work: LaneWork, items: list[Handling], tried: Tried, savepoints: bool,
                           pending: Pending) -> list[Decided] | None:
        """admit -> call -> decide, per message in stream order; then record. None: redo (_attempt)."""
        order = replays_first(items)
        admissions = await self.inbox.admit(work, inbox_items(order))
        decided: dict[Handling, Decided] = {}
        first_copy: dict[uuid.UUID, Decided] = {}
        copies: dict[uuid.UUID, int] = {}  # further copies skipped, by message id: the inbox counts them
        for item in order:
            message_id = item.message_id
            first = first_copy.get(message_id) if message_id is not None else None
            if item.for_another or first is not None:  # not ours to run; a copy is settled as its first
                after = self._after(item, pending, holding=False)
                decided[item] = done = await self._conclude(
                    item, copy_of(first.verdict, after=after) if first else Duplicate(), pending, after,
                    copy=first is not None)
                if done.copy and isinstance(done.verdict, Duplicate):
                    copies[message_id] = copies.get(message_id, 0) + 1
                continue
            # Without an inbox (at-least-once mode) nothing counts attempts: JetStream's deliveries do.
            admission, attempts = admissions.get(message_id, (Admission.NEW, item.delivered - 1))
            tried.attempts[item] = attempts
            duplicate = admission == Admission.DUPLICATE
            after = self._after(item, pending, holding=self.config.ordered)
            result, attempted = None, False
            if not duplicate and not item.rejected and not (self.config.ordered and after is not None):
                result = await self._call(work, item, tried, savepoints)
                if result is None:
                    return None
                attempted = result.outcome is not Outcome.BUSY  # it runs elsewhere: no attempt
            attempt = attempt_number(attempts, attempted)
            verdict = decide(duplicate=duplicate, rejected=item.rejected, after=after, result=result,
                             attempt=attempt, max_deliver=self.spec.max_deliver, backoff=self.backoff)
            if result is not None and not result.done:
                self._failed_attempt(item, result, verdict, attempt)
            # frees what waits behind it, in this lane too
            decided[item] = done = await self._conclude(item, verdict, pending, after, attempts=attempts,
                                                        attempted=attempted)
            if message_id is not None:
                first_copy[message_id] = done
        await self.inbox.record(work, [self._outcome(done, copies.get(message_id, 0))
                                       for message_id, done in first_copy.items()])
        return [decided[item] for item in items]

    def _after(self, item: Handling, pending: Pending, *, holding: bool) -> float | None:
        """How long it must stay away to come back behind its aggregate's earlier ones (seamq.holds)."""
        if not pending and not holding:  # nothing of this lane sent back yet: the usual case
            return None
        return self._holds.after(item.aggregate, item.seq, pending, fetched=item.fetched if holding else None)

    async def _conclude(self, item: Handling, verdict: Verdict, pending: Pending, after: float | None, *,
                        attempts: int = 0, attempted: bool = False, copy: bool = False) -> Decided:
        """The one place a message's verdict is given. A dead letter is published first: if that
        fails it is not ACKed but sent back (verdict.dead_letter_failed). Copies of one message id
        share its dead letter's Nats-Msg-Id, so publishing one again (a lane run twice) stores nothing."""
        dlq_seq = None
        if isinstance(verdict, DeadLetter) and not copy:
            verdict, dlq_seq = await self._dead_letter(item, verdict, after, attempt_number(attempts, attempted))
        if isinstance(verdict, Nak):
            pending.note(item.aggregate, item.seq, verdict.delay)
        elif self.config.ordered:  # done: it no longer holds its aggregate back (unordered, nothing is held)
            pending.note(item.aggregate, item.seq, None)
        return Decided(item, verdict, attempts, attempted, copy, dlq_seq)

    def _outcome(self, done: Decided, copies: int) -> InboxOutcome:
        verdict, item = done.verdict, done.item
        dead = None
        if isinstance(verdict, DeadLetter):
            dead = DeadLettered(verdict.reason.value, verdict.detail, dead_letter.subject(self.spec, item.msg.subject),
                                done.dlq_seq)
        return InboxOutcome(item.message_id, done=isinstance(verdict, Ack),
                            error=verdict.error if isinstance(verdict, Nak) else None, dead_letter=dead,
                            copies=copies, attempts=done.attempts + done.attempted, attempted=done.attempted)

    def _failed_attempt(self, item: Handling, result: HandlerResult, verdict: Verdict, attempt: int) -> None:
        """Every failed attempt is told, with what it will cost: a retry in so long, or the DLQ."""
        if result.outcome is Outcome.BUSY:
            log.info("handler_busy", consumer=self.spec.name, message_id=str(item.message_id),
                     detail="the service is handling it in another call", then=f"again in {verdict.delay:.1f}s")
            return
        log.warning("handler_failed", consumer=self.spec.name, message_id=str(item.message_id),
                    event_type=f"{item.envelope.event_type}.v{item.envelope.event_version}", attempt=attempt,
                    max_deliver=self.spec.max_deliver, outcome=result.outcome.value, error=result.detail,
                    then=(f"retry in {verdict.delay:.1f}s" if isinstance(verdict, Nak)
                          else f"dead letter ({verdict.reason.value})"))

    async def _call(self, work: LaneWork, item: Handling, tried: Tried, savepoints: bool) -> HandlerResult | None:
        """The handler's result; None when an in-process handler failed on the fast path (no savepoint
        to undo its writes alone). `work.conn` is what in-process handlers write through."""
        envelope = item.envelope
        handler = item.handler
        with continue_trace(envelope.subject, item.msg.headers, here=handler.transactional) as traceparent:
            if not handler.transactional:  # kept across a lane's redo: an HTTP handler is never called twice
                if item not in tried.answers:
                    tried.answers[item] = await self._guarded(item, handler(envelope, None, traceparent))
                return tried.answers[item]
            conn = work.conn
            if conn is None:  # no inbox, no transaction: nothing to undo
                return await self._guarded(item, handler(envelope, conn, traceparent))
            if not savepoints:
                try:
                    result = await handler(envelope, conn, traceparent)
                except Exception:  # the transaction may be broken: the redo, with savepoints, tells it
                    return None
                return result if result.done else None
            await work.savepoint()
            result = await self._guarded(item, handler(dataclasses.replace(envelope, rerun=True), conn, traceparent))
            await (work.release() if result.done else work.undo())  # a failed handler's writes vanish
            return result

    async def _guarded(self, item: Handling, call) -> HandlerResult:
        """A handler (or a wrapper of ours around it) that raises instead of returning an outcome
        failed this message's attempt, and only this message's."""
        _lane_beat.get().turn()
        try:
            return await call
        except Exception as exc:
            detail = f"consumer error: {describe(exc)}"[:500]
            log.error("consumer_handler_raised", consumer=self.spec.name, message_id=str(item.message_id),
                      error=detail)
            return HandlerResult(Outcome.RETRY, detail)

    async def _dead_letter(self, item: Handling, verdict: DeadLetter, after: float | None,
                           attempt: int) -> tuple[DeadLetter | Nak, int | None]:
        """Publish its EVT-047-002, and where it was stored; a failed publish sends it back instead of ACKing it."""
        (result,) = await self.dlq.publish_many([item.dead_letter(self.spec, verdict, self.max_payload, attempt)])
        if not result.ok:
            return dead_letter_failed(verdict, result.error, attempt=attempt, backoff=self.backoff, after=after), None
        log.warning("message_dead_lettered", consumer=self.spec.name, message_id=str(item.message_id),
                    subject=item.msg.subject, reason=verdict.reason.value, detail=verdict.detail[:300])
        return verdict, result.seq

    async def _settle(self, decided: list[Decided]) -> None:
        """The one place a delivery is ACKed or NAKed, from its verdict alone."""
        for done in decided:
            try:
                if done.ack:
                    await done.item.msg.ack()
                else:
                    await done.item.msg.nak(delay=done.verdict.delay)
            except Exception as exc:  # lost ack: redelivered, then skipped as a duplicate
                log.info("consumer_ack_failed", consumer=self.spec.name, error=str(exc))
