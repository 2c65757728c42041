"""The dead-letter port (seamq.ports.DeadLetterRepository): what every implementation must do, checked
against each, as River's drivers pass one shared suite. Dead letters are made as production makes
them, through the inbox port of the same store; each case then asks only what the port answers.
The in-memory one (seamq.memory_dead_letters) is what the replay and the desk's unit tier run on."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

from seamq.backoff import NO_JITTER, Backoff
from seamq.dead_letter import DlqFilter, ReplayPolicy, cause
from seamq.ids import uuid7
from seamq.memory import MemoryInbox
from seamq.memory_dead_letters import MemoryDeadLetters
from seamq.ports import DeadLettered, InboxItem, InboxOutcome

SEA, BILLING = "sea__from_vibespro", "billing__from_vibespro"


@dataclass
class Store:
    inbox: Callable[[str], Any]  # consumer -> its inbox (seamq.ports.InboxRepository)
    dead: Any  # the DeadLetterRepository


@pytest.fixture
async def store(database):
    if database is None:
        inboxes = {SEA: MemoryInbox(), BILLING: MemoryInbox()}
        yield Store(inboxes.__getitem__, MemoryDeadLetters(inboxes))
        return
    from seamq.pg.dlq_repo import PgDeadLetters
    from seamq.pg.inbox_repo import PgInbox, consumer_session
    from seamq.wiring import pg_pool

    async with pg_pool(database, configure=consumer_session) as pool:
        yield Store(lambda consumer: PgInbox(consumer, pool), PgDeadLetters(pool))


async def dead_letter(store: Store, consumer: str = SEA, *, reason: str = "handler_error", detail: str = "boom",
                      event_type: str = "order_placed", failures: tuple[str, ...] = ()) -> uuid.UUID:
    """A message whose handler failed `failures` times and then was dead-lettered with `reason`."""
    inbox, item = store.inbox(consumer), InboxItem(uuid7(), f"vibespro.event.{event_type}.v1", event_type, 1, None)
    for attempt, error in enumerate((*failures, None), start=1):
        async with inbox.transaction() as work:
            await inbox.admit(work, [item])
            dead = DeadLettered(reason, detail, f"sea.dlq.vibespro.{event_type}.v1", 40 + attempt) if error is None \
                else None
            await inbox.record(work, [InboxOutcome(item.message_id, error=error, dead_letter=dead, attempts=attempt)])
    return item.message_id


async def handled(store: Store, consumer: str = SEA) -> uuid.UUID:
    inbox, item = store.inbox(consumer), InboxItem(uuid7(), "vibespro.event.order_placed.v1", "order_placed", 1, None)
    async with inbox.transaction() as work:
        await inbox.admit(work, [item])
        await inbox.record(work, [InboxOutcome(item.message_id, done=True)])
    return item.message_id


async def select(store: Store, **chosen: Any) -> list:
    async with store.dead.transaction() as tx:
        return await store.dead.select(tx, DlqFilter(**chosen))


async def test_dead_letters_are_listed_oldest_first_each_with_the_selection_s_total(store):
    first = await dead_letter(store, failures=("HTTP 500",))
    second = await dead_letter(store, reason="handler_rejected", detail="total must be positive", event_type="paid")
    third = await dead_letter(store, BILLING)
    await handled(store)
    rows = await select(store)
    assert [row.key for row in rows] == [(SEA, first), (SEA, second), (BILLING, third)]
    row = rows[0]
    assert (row.subject, row.event, row.status, row.attempts, row.last_error, row.total) == (
        "vibespro.event.order_placed.v1", "order_placed.v1", "dead_lettered", 2, "handler_error: boom", 3)
    assert (row.state.reason, row.state.detail, row.state.dlq_subject, row.state.dlq_seq, row.state.replay_attempts) \
        == ("handler_error", "boom", "sea.dlq.vibespro.order_placed.v1", 42, 0)
    assert row.state.dead_lettered_at is not None and not row.state.closed
    assert row.cause == cause("handler_error", "handler_error: boom")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    for chosen, expected in [
        (dict(limit=1), [first]), (dict(consumer=BILLING), [third]), (dict(context="sea"), [first, second]),
        (dict(event_type="paid"), [second]), (dict(reason="handler_rejected"), [second]),
        (dict(text="POSITIVE"), [second]), (dict(ids=[third, first]), [first, third]),
        (dict(prefix=str(second)[:30]), [second]), (dict(older_than=3600), []), (dict(older_than=0), [first, second, third]),
        (dict(since=later), []), (dict(until=later), [first, second, third]),
    ]:
        found = await select(store, **chosen)
        assert [row.message_id for row in found] == expected, chosen
    assert [row.total for row in await select(store, context="sea")] == [2, 2]
    assert [row.total for row in await select(store, limit=1)] == [3]  # the total counts beyond the limit


async def test_groups_by_cause_with_ids_and_numbers_blanked_and_an_http_status_kept(store):
    for n in (1, 22):
        await dead_letter(store, reason="max_deliver", detail=f"HTTP 503: order {n} of {uuid.uuid4()} timed out")
    await dead_letter(store, BILLING, reason="max_deliver", detail=f"HTTP 503: order 7 of {uuid.uuid4()} timed out")
    await dead_letter(store, reason="max_deliver", detail="HTTP 404: order 7 not found")
    async with store.dead.transaction() as tx:
        groups = await store.dead.groups(tx, DlqFilter())
    assert [(g.cause, g.reason, g.count, g.consumers) for g in groups] == [
        ("max_deliver: HTTP 503: order # of # timed out", "max_deliver", 3, 2),
        ("max_deliver: HTTP 404: order # not found", "max_deliver", 1, 1)]
    assert all(g.first_at is not None and g.first_at <= g.last_at for g in groups)
    assert len(await select(store, cause=groups[0].cause)) == 3
    # The Python rule the in-memory store groups by is PostgreSQL's seamq_dlq_cause: one answer.
    assert {row.cause for row in await select(store)} == {g.cause for g in groups} == {
        cause(row.state.reason, row.last_error) for row in await select(store)}


async def test_replays_are_scheduled_by_reason_counted_watched_and_exhausted_at_the_cap(store):
    replayable = await dead_letter(store)
    await dead_letter(store, reason="handler_rejected")  # not replayed by itself
    policy = ReplayPolicy(Backoff(base=0, spread=NO_JITTER), max_attempts=2, reasons=("handler_error",))

    async def due() -> list:
        async with store.dead.transaction() as tx:
            await store.dead.schedule(tx, policy)
        async with store.dead.transaction() as tx:
            return await store.dead.due(tx)

    async def replayed(watchdog: float) -> None:
        async with store.dead.transaction() as tx:
            await store.dead.mark_replayed(tx, SEA, replayable, watchdog)

    [row] = await due()
    assert row.key == (SEA, replayable) and row.state.replay_delay == 0 and row.state.next_replay_at is not None
    await replayed(watchdog=3600)
    assert await due() == []  # watched: due again only if it never comes back
    [row] = await select(store, ids=[replayable])
    assert (row.state.replay_attempts, row.state.last_reason, row.status) == (1, "handler_error", "dead_lettered")
    await replayed(watchdog=0)
    assert await due() == []  # two replays of two: out of them
    [row] = await select(store, ids=[replayable])
    assert (row.status, row.state.replay_attempts) == ("exhausted", 2) and row.state.exhausted_at is not None
    await replayed(watchdog=3600)  # a person's replay of an exhausted one: dead-lettered again, and counted
    [row] = await select(store, ids=[replayable])
    assert (row.status, row.state.replay_attempts) == ("dead_lettered", 3)


async def test_a_row_comes_with_its_failed_attempts_oldest_first(store):
    message = await dead_letter(store, failures=("HTTP 500: a", "HTTP 500: b"))
    async with store.dead.transaction() as tx:
        [row] = await store.dead.with_attempts(tx, await store.dead.select(tx, DlqFilter(ids=[message])))
    assert [(a.attempt, a.error) for a in row.failed_attempts] == [(1, "HTTP 500: a"), (2, "HTTP 500: b"), (3, "boom")]
    assert row.failed_attempts[0].failed_at <= row.failed_attempts[-1].failed_at


async def test_purged_and_edited_ones_are_closed_and_listed_only_when_asked_for(store):
    purged, edited, open_ = [await dead_letter(store) for _ in range(3)]
    new_id = uuid7()
    async with store.dead.transaction() as tx:
        await store.dead.mark_purged(tx, SEA, purged)
        assert await store.dead.mark_edited(tx, SEA, edited, new_id, "test:ada")
        assert not await store.dead.mark_edited(tx, SEA, edited, uuid7(), "test:bob")  # closed already
    assert [row.message_id for row in await select(store)] == [open_]
    closed = {row.message_id: row for row in await select(store, purged=True)}
    assert set(closed) == {purged, edited, open_}
    assert (closed[purged].status, closed[purged].state.closed, closed[purged].state.purged_at is not None) == \
        ("exhausted", True, True)
    assert (closed[edited].status, closed[edited].state.edited_as, closed[edited].state.edited_by) == \
        ("exhausted", str(new_id), "test:ada")


async def test_actions_are_recorded_latest_first_and_an_unfinished_one_says_so(store):
    a, b = await dead_letter(store), await dead_letter(store)
    async with store.dead.transaction() as tx:
        first = await store.dead.start_action(tx, "test:ada", "dlq.replay", [a, b], {"why": "fixed"})
        await store.dead.finish_action(tx, first, 2, {"note": "both"})
        second = await store.dead.start_action(tx, "test:bob", "dlq.purge", [b], {})
    async with store.dead.transaction() as tx:
        recent = await store.dead.actions(tx)
        of_b = await store.dead.actions(tx, message_id=b)
        of_a = await store.dead.actions(tx, message_id=a)
    assert [(x.id, x.actor, x.action, x.selected, x.messages, x.done) for x in recent] == [
        (second, "test:bob", "dlq.purge", 1, 1, None), (first, "test:ada", "dlq.replay", 2, 2, 2)]
    assert recent[0].finished_at is None and recent[1].finished_at is not None
    assert dict(recent[1].detail) == {"why": "fixed", "note": "both"}
    assert [x.id for x in of_b] == [first, second] and [x.id for x in of_a] == [first]


async def test_a_unit_of_work_that_fails_leaves_nothing(store):
    message = await dead_letter(store)
    with pytest.raises(RuntimeError):
        async with store.dead.transaction() as tx:
            await store.dead.mark_purged(tx, SEA, message)
            await store.dead.start_action(tx, "test:ada", "dlq.purge", [message], {})
            raise RuntimeError("the purge broke before its commit")
    [row] = await select(store)
    assert row.message_id == message and not row.state.closed
    async with store.dead.transaction() as tx:
        assert await store.dead.actions(tx) == []


async def test_a_message_is_found_by_a_prefix_of_its_id_in_each_consumer_that_has_it_in_any_state(store):
    item = InboxItem(uuid7(), "vibespro.event.order_placed.v1", "order_placed", 1, None)
    for consumer in (SEA, BILLING):
        inbox = store.inbox(consumer)
        async with inbox.transaction() as work:
            await inbox.admit(work, [item])
            await inbox.record(work, [InboxOutcome(item.message_id, done=True)])
    dead = await dead_letter(store)
    async with store.dead.transaction() as tx:
        both = await store.dead.inbox_rows(tx, str(item.message_id)[:-1])
        [lone] = await store.dead.inbox_rows(tx, str(dead))
        nothing = await store.dead.inbox_rows(tx, "ffffffff")
    assert [(r.consumer, r.message_id, r.status) for r in both] == [(BILLING, item.message_id, "processed"),
                                                                    (SEA, item.message_id, "processed")]
    assert (lone.consumer, lone.status, lone.last_error) == (SEA, "dead_lettered", "handler_error: boom") and nothing == []
