"""The consumer's lane through its ports alone: in-memory inbox, deliveries and DLQ (seamq.memory).

What the end-to-end tests show against real servers, shown here in milliseconds and without them,
which is only possible because no driver type reaches the worker.
"""

from __future__ import annotations

import asyncio
import copy
import json
from contextlib import asynccontextmanager

from structlog.testing import capture_logs

from seamq.consumer import InboxConsumer
from seamq.envelope import HandlerResult, Outcome
from seamq.settings import ConsumerSettings

from helpers.lane import SPEC, event, publish
from seamq.memory import (
    MemoryDeliveries, MemoryDelivery, MemoryInbox, MemoryLaneWork, MemoryPublisher, MemoryTransaction,
)
from seamq.model import Event, message_headers
from seamq.republish import Copy

class Script:
    """A handler that answers from a script per (aggregate, n) and attempt, and notes each call."""

    transactional = False

    def __init__(self, answers: dict | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, envelope, conn, traceparent=None) -> HandlerResult:
        key = (envelope.aggregate_id, envelope.payload["n"])
        self.calls.append(key)
        script = self.answers.get(key, [])
        attempt = sum(1 for c in self.calls if c == key)
        return script[attempt - 1] if attempt <= len(script) else HandlerResult(Outcome.OK)


async def run(source, inbox, dlq, handler, until, **config) -> None:
    consumer = InboxConsumer(SPEC, source, inbox, dlq, lambda t, v: handler,
                             ConsumerSettings(**{"nak_base": 0.01, "nak_max": 0.02, "concurrency": 2, **config}))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    for _ in range(400):
        if until():
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_handled_once_acked_and_recorded_processed():
    source, inbox, dlq, handler = MemoryDeliveries(), MemoryInbox(), MemoryPublisher(), Script()
    events = [event("a", n) for n in range(5)]
    for e in events:
        publish(source, e)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 5)
    assert handler.calls == [("a", n) for n in range(5)]
    assert {row.status for row in inbox.rows.values()} == {"processed"} and len(inbox.rows) == 5
    assert not dlq.published and not source.naks


async def test_a_retry_comes_back_and_is_handled_on_its_second_delivery():
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher()
    handler = Script({("a", 0): [HandlerResult(Outcome.RETRY, "503")]})
    e = event("a", 0)
    publish(source, e)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 1)
    row = inbox.rows[e.id]
    assert (row.status, row.attempts, row.last_error) == ("processed", 2, "503")
    assert [(a.attempt, a.error) for a in row.history] == [(1, "503")], "the failed attempt is kept after the retry succeeded"
    assert source.acked[0].delivered == 2 and len(source.naks) == 1


async def test_poison_and_max_deliver_go_to_the_dlq_with_their_reasons():
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher()
    retry = HandlerResult(Outcome.RETRY, "timeout")
    handler = Script({("a", 0): [HandlerResult(Outcome.POISON, "negative")], ("b", 0): [retry] * 5})
    poison, tired = event("a", 0), event("b", 0)
    publish(source, poison)
    publish(source, tired)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 2)
    assert inbox.rows[poison.id].state.reason == "handler_rejected"
    assert inbox.rows[tired.id].state.reason == "max_deliver"
    assert inbox.rows[tired.id].attempts == SPEC.max_deliver
    assert sorted(m.headers["Seamq-Dlq-Reason"] for m in dlq.published) == ["handler_rejected", "max_deliver"]


async def test_a_redelivered_processed_message_is_a_duplicate_and_not_handled_again():
    source, inbox, dlq, handler = MemoryDeliveries(), MemoryInbox(), MemoryPublisher(), Script()
    e = event("a", 0)
    publish(source, e)
    publish(source, e)  # the same message id again (a publisher's retry, or a redelivery)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 2)
    assert handler.calls == [("a", 0)]
    assert inbox.rows[e.id].status == "processed" and inbox.rows[e.id].duplicates == 1


async def test_an_aggregates_later_messages_wait_behind_its_failed_one():
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher()
    handler = Script({("a", 0): [HandlerResult(Outcome.RETRY, "503")]})
    for n in range(4):
        publish(source, event("a", n))
        publish(source, event("b", n))
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 8, lane_batch=1)
    handled_a = [n for aggregate, n in handler.calls if aggregate == "a"]
    assert handled_a == [0, 0, 1, 2, 3], "a's messages in stream order, the failed one first"
    assert [n for aggregate, n in handler.calls if aggregate == "b"] == [0, 1, 2, 3]


async def test_a_dead_letter_that_cannot_be_published_is_not_acked():
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher(fail=True)
    handler = Script({("a", 0): [HandlerResult(Outcome.POISON, "bad")] * 50})
    e = event("a", 0)
    publish(source, e)
    await run(source, inbox, dlq, handler, lambda: len(source.naks) >= 2)
    assert not source.acked
    assert inbox.rows[e.id].status == "received"
    assert inbox.rows[e.id].last_error.startswith("DLQ publish failed (no responders)")


async def test_holds_cost_no_attempts_a_good_message_held_many_times_is_never_dead_lettered():
    """The soak's case: every delivery that only held a message behind its aggregate counted
    against max_deliver, so a message that failed once was dead-lettered as `max_deliver`."""
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher()
    retry = HandlerResult(Outcome.RETRY, "503")
    handler = Script({("a", 0): [retry, retry], ("a", 1): [retry, retry]})  # max_deliver is 3: both fit
    events = [event("a", n) for n in range(3)]
    for e in events:
        publish(source, e)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 3, lane_batch=1)
    assert not dlq.published, [m.headers.get("Seamq-Dlq-Reason") for m in dlq.published]
    assert [n for _, n in handler.calls] == [0, 0, 0, 1, 1, 1, 2], "in order, each failed one retried"
    assert {d.seq: d.delivered for d in source.acked}[2] > SPEC.max_deliver, "held, then failed twice"
    assert [inbox.rows[e.id].attempts for e in events] == [3, 3, 1]
    assert inbox.rows[events[2].id].history == [], "held, never failed: no attempt in its history"


async def test_a_slow_lane_keeps_order_the_grace_runs_from_when_a_message_was_fetched(monkeypatch):
    """A lane that reaches a later message long after it was fetched (a busy machine, a deep queue)
    must still hold it behind its aggregate's failed one, redelivered on time but queued behind it.
    Judged by the clock when the lane got to it, the grace had run out and it overtook the failed one
    (seen: the partitions soak, on a machine slowed down several times)."""
    import seamq.holds

    monkeypatch.setattr(seamq.holds, "HOLD_GRACE", 0.05)
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher()

    class Slow(Script):
        async def __call__(self, envelope, conn, traceparent=None):
            if envelope.aggregate_id == "f":
                await asyncio.sleep(0.03)  # ten of them: the lane reaches a-1 0.3 s after fetching it
            return await super().__call__(envelope, conn, traceparent)

    handler = Slow({("a", 0): [HandlerResult(Outcome.RETRY, "503")]})
    publish(source, event("a", 0))
    for n in range(10):
        publish(source, event("f", n))
    publish(source, event("a", 1))
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 12, concurrency=1, lane_batch=1)
    assert [n for aggregate, n in handler.calls if aggregate == "a"] == [0, 0, 1]


async def test_a_replay_fetched_with_a_stale_redelivery_of_its_original_is_run_not_skipped_as_its_copy():
    """A dead letter's original, its ack lost (the consumer stalled past ack_wait), comes back in the
    same fetch as the DLQ replay of it. The stale one came first and was settled a duplicate; the
    replay, a copy of the same message id, was settled as it: acked, never run, while
    `seamq dlq replay` said "replayed 1 of 1" (CI, stop 53). The replay is what runs."""
    source, inbox, dlq = MemoryDeliveries(), MemoryInbox(), MemoryPublisher()
    handler = Script({("a", 0): [HandlerResult(Outcome.POISON, "not yet")]})
    e = event("a", 0)
    publish(source, e)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 1)
    assert inbox.rows[e.id].status == "dead_lettered"
    original = source.acked[0]
    replay = Copy(original.subject, original.headers, original.data, str(e.id), msg_id=f"replay:{SPEC.name}:{e.id}:1",
                  replay_attempt=1, consumer=SPEC.name).message()
    source.publish(original.subject, original.headers, original.data, delivered=2)  # the stale redelivery
    source.publish(replay.subject, replay.headers, replay.payload)
    await run(source, inbox, dlq, handler, lambda: len(source.acked) == 3, concurrency=1, batch_size=10)
    row = inbox.rows[e.id]
    assert handler.calls == [("a", 0), ("a", 0)], "the replay ran"
    assert (row.status, row.duplicates) == ("processed", 1)
    assert not source.naks and len(dlq.published) == 1


async def test_a_lost_send_back_holds_its_aggregate_until_its_message_comes_back(monkeypatch):
    """A NAK can be lost: written to a server cut off before the client noticed, or sent as the
    consumer's leader changed. The server then sends its message again only when ack_wait runs out,
    long after its NAK delay. A later message of its aggregate overtook it ("o-150 handled out of
    order: 50 after 62", "o-32: 24 after 35" in the partition tests): a grace of 5 s had run out."""
    import seamq.holds

    monkeypatch.setattr(seamq.holds, "HOLD_GRACE", 0.05)  # the least grace; ack_wait (120 s) is longer
    source, inbox, dlq = MemoryDeliveries(redeliver=False), MemoryInbox(), MemoryPublisher()  # nothing comes back
    handler = Script({("a", 0): [HandlerResult(Outcome.RETRY, "503")]})
    consumer = InboxConsumer(SPEC, source, inbox, dlq, lambda t, v: handler,
                             ConsumerSettings(nak_base=0.01, nak_max=0.02, concurrency=1))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))

    async def until(condition) -> None:
        for _ in range(1000):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("not within 10 s")

    first = event("a", 0)
    publish(source, first)
    await until(lambda: len(source.naks) == 1)  # sent back, and lost
    await asyncio.sleep(0.2)  # its NAK delay and the least grace are long past
    second = event("a", 1)
    publish(source, second)
    await until(lambda: len(source.naks) == 2)
    assert handler.calls == [("a", 0)], "the later one is held, not run"
    def again(seq: int, e) -> None:  # the server sends a message again: the same stream sequence
        source.ready.append(MemoryDelivery(str(e.subject), message_headers(e), json.dumps(e.payload).encode(),
                                           seq, source, delivered=2))

    again(1, first)  # ack_wait ran out
    await until(lambda: len(source.acked) == 1)
    again(2, second)  # its hold's delay ran out
    await until(lambda: len(source.acked) == 2)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert handler.calls == [("a", 0), ("a", 0), ("a", 1)]


async def test_a_delivery_lost_on_the_way_holds_its_aggregate_until_it_comes_again():
    """A message sent and never received (a connection cut) comes again only after ack_wait. The
    source names it (seamq.nats.gaps); its aggregate's later message waits for it, and another
    aggregate does not. Without that, a1 ran before a0 (the partitions lab: "o-63: 191 after 192")."""

    source, inbox, dlq, handler = MemoryDeliveries(), MemoryInbox(), MemoryPublisher(), Script()
    a0, a1, b0 = event("a", 0), event("a", 1), event("b", 0)
    sent = [publish(source, e) for e in (a0, a1, b0)]
    source.lose(sent[0], back_after=0.3)
    consumer = InboxConsumer(SPEC.model_copy(update={"ack_wait": 0.5}), source, inbox, dlq, lambda t, v: handler,
                             ConsumerSettings(nak_base=0.01, nak_max=0.02, concurrency=2))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    for _ in range(3000):
        if len(source.acked) == 3:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [c for c in handler.calls if c[0] == "a"] == [("a", 0), ("a", 1)]
    assert handler.calls[0] == ("b", 0), "another aggregate is not held"
    held = [s for s, _ in source.naks]
    assert len(source.acked) == 3 and held and set(held) == {2}, f"a1 held behind a0, nothing else: {held}"


async def test_after_a_reconnect_an_aggregate_waits_for_its_failed_message_however_long_it_was_away(monkeypatch):
    """The consumer's host was cut off just as a0 failed: its NAK, and JetStream's delivery of it
    again, were lost with the connection; it comes back only ack_wait after the reconnect, after a1
    came again. a1 waits for it. Before, the hold ran out ack_wait after a0's NAK, and the partitions
    lab handled o-110's 70 after its 77."""
    from seamq import holds

    monkeypatch.setattr(holds, "HOLD_GRACE", 0.3)  # the grace is then ack_wait + 1 s: 1.1 s
    source, inbox, dlq = MemoryDeliveries(redeliver=False), MemoryInbox(), MemoryPublisher()
    handler = Script({("a", 0): [HandlerResult(Outcome.RETRY, "503")]})
    a0, a1 = (publish(source, event("a", n)) for n in range(2))

    def again(d: MemoryDelivery, delivered: int) -> None:
        source.ready.append(MemoryDelivery(d.subject, d.headers, d.data, d.seq, source, delivered))

    consumer = InboxConsumer(SPEC.model_copy(update={"ack_wait": 0.1}), source, inbox, dlq, lambda t, v: handler,
                             ConsumerSettings(nak_base=0.01, nak_max=0.02, concurrency=2))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await wait_until(lambda: len(source.naks) == 2)  # a0 failed, a1 held behind it; both lost
        await asyncio.sleep(1.3)  # away longer than the grace (ack_wait + 1 s)
        source.reconnected()
        with capture_logs() as logs:
            again(a1, 2)  # a1 comes again first
            await wait_until(lambda: len(source.naks) == 3, f"a1 held again (handled: {handler.calls})")
        assert [e["aggregates"] for e in logs if e["event"] == "consumer_holds_renewed"] == [1], logs
        assert source.naks[-1][0] == a1.seq and handler.calls == [("a", 0)], "a1 waits for a0"
        again(a0, 3)
        await wait_until(lambda: handler.calls[-1:] == [("a", 0)] and len(handler.calls) == 2)
        again(a1, 3)
        await wait_until(lambda: len(source.acked) == 2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert handler.calls == [("a", 0), ("a", 0), ("a", 1)]


async def wait_until(condition, what: str = "", seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within {seconds:g} s: {what}")


class Lanes(MemoryInbox):
    """The in-memory inbox with a connection in each lane, as PostgreSQL's has: an in-process
    handler that fails on the fast path has the lane run again, with a savepoint each."""

    @asynccontextmanager
    async def transaction(self):
        before = copy.deepcopy(self.rows)
        work = MemoryLaneWork(MemoryTransaction())
        try:
            yield work
        except BaseException:
            self.rows = before
            raise
        if work.abandoned:
            self.rows = before


async def test_a_lane_run_again_decides_anew_and_never_calls_an_http_handler_twice():
    source, inbox, dlq, http = MemoryDeliveries(), Lanes(), MemoryPublisher(), Script()
    seen: list[bool] = []

    async def in_process(envelope, conn, traceparent=None) -> HandlerResult:
        seen.append(envelope.rerun)
        return HandlerResult(Outcome.RETRY, "not yet")
    in_process.transactional = True
    liked = Event(context="vibespro", aggregate_type="vibe", aggregate_id="b", event_type="vibe_liked", payload={})
    consumer = InboxConsumer(SPEC, source, inbox, dlq, lambda t, v: http if t == "vibe_created" else in_process,
                             ConsumerSettings(nak_base=0.01, nak_max=0.02))
    first, second = event("a", 0), liked
    decided = await consumer.handle([publish(source, first), publish(source, second)])
    assert http.calls == [("a", 0)], "its answer is kept for the run with savepoints"
    assert seen == [False, True], "the in-process handler failed on the fast path, then ran in a savepoint"
    assert [(type(d.verdict).__name__, d.attempted, d.attempt) for d in decided] == [("Ack", True, 1), ("Nak", True, 1)]
    assert (inbox.rows[first.id].status, inbox.rows[second.id].status, inbox.rows[second.id].attempts) == (
        "processed", "received", 1)
    assert len(source.acked) == 1 and len(source.naks) == 1
