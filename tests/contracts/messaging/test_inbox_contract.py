"""The inbox port (seamq.ports.InboxRepository): what every inbox must do, checked against each one,
as River's drivers pass one shared suite. The in-memory inbox (seamq.memory) is what the unit tier
and the users' kit run the real consumer on, so it may not judge a message otherwise than
PostgreSQL does: each case here runs on both, and asks only what the port itself answers."""

from __future__ import annotations

import pytest

from seamq.ids import uuid7
from seamq.memory import MemoryInbox
from seamq.ports import Admission, DeadLettered, InboxItem, InboxOutcome


@pytest.fixture
async def inbox(database):
    if database is None:
        yield MemoryInbox()
        return
    from seamq.pg.inbox_repo import PgInbox, consumer_session
    from seamq.wiring import pg_pool

    async with pg_pool(database, configure=consumer_session) as pool:
        yield PgInbox("contract", pool)


def item(message_id=None, *, replay: bool = False) -> InboxItem:
    return InboxItem(message_id or uuid7(), "sea.orders.v1", "order_placed", 1, None, replay=replay)


async def lane(inbox, items: list[InboxItem], outcome=None) -> dict:
    """One lane: admit, then record what `outcome(item, admitted)` says (nothing recorded: None)."""
    async with inbox.transaction() as work:
        admitted = await inbox.admit(work, items)
        if outcome is not None:
            await inbox.record(work, [outcome(i, admitted[i.message_id]) for i in items])
    return admitted


def handled(i, admitted):
    return InboxOutcome(i.message_id, done=True, attempts=admitted[1] + 1)


def failed(i, admitted):
    return InboxOutcome(i.message_id, error="boom", attempts=admitted[1] + 1)


def dead(i, admitted):
    return InboxOutcome(i.message_id, dead_letter=DeadLettered("handler_error", "boom", "dlq.x", 7),
                        attempts=admitted[1] + 1)


async def test_a_message_is_new_once_and_a_duplicate_once_handled(inbox):
    a, b = item(), item()
    assert await lane(inbox, [a, b], handled) == {a.message_id: (Admission.NEW, 0), b.message_id: (Admission.NEW, 0)}
    assert await lane(inbox, [a], handled) == {a.message_id: (Admission.DUPLICATE, 1)}


async def test_a_failed_attempt_is_retried_with_its_count_until_it_is_handled(inbox):
    a = item()
    await lane(inbox, [a], failed)
    assert await lane(inbox, [a], failed) == {a.message_id: (Admission.RETRY, 1)}
    assert await lane(inbox, [a], handled) == {a.message_id: (Admission.RETRY, 2)}
    assert await lane(inbox, [a]) == {a.message_id: (Admission.DUPLICATE, 3)}


async def test_a_lane_that_fails_or_is_abandoned_leaves_nothing(inbox):
    a, b = item(), item()
    with pytest.raises(RuntimeError):
        async with inbox.transaction() as work:
            await inbox.admit(work, [a])
            await inbox.record(work, [handled(a, (Admission.NEW, 0))])
            raise RuntimeError("the lane broke before its commit")
    async with inbox.transaction() as work:
        await inbox.admit(work, [b])
        await inbox.record(work, [handled(b, (Admission.NEW, 0))])
        work.abandon()
    assert await lane(inbox, [a, b]) == {a.message_id: (Admission.NEW, 0), b.message_id: (Admission.NEW, 0)}


async def test_a_new_message_held_back_is_seen_again_as_unprocessed(inbox):
    a = item()
    await lane(inbox, [a], lambda i, admitted: InboxOutcome(i.message_id, attempts=0, attempted=False))
    assert (await lane(inbox, [a]))[a.message_id][0] == Admission.RETRY


async def test_a_dead_letter_is_a_duplicate_unless_replayed_and_a_replay_starts_a_new_round(inbox):
    a = item()
    await lane(inbox, [a], dead)
    assert await lane(inbox, [a]) == {a.message_id: (Admission.DUPLICATE, 1)}
    assert await lane(inbox, [item(a.message_id, replay=True)], handled) == {a.message_id: (Admission.REPLAY, 0)}
    assert await lane(inbox, [item(a.message_id, replay=True)]) == {a.message_id: (Admission.DUPLICATE, 1)}


async def test_a_replay_of_a_handled_message_is_a_duplicate(inbox):
    a = item()
    await lane(inbox, [a], handled)
    assert await lane(inbox, [item(a.message_id, replay=True)]) == {a.message_id: (Admission.DUPLICATE, 1)}


async def test_copies_in_one_lane_are_one_row(inbox):
    a = item()
    admitted = await lane(inbox, [a, item(a.message_id)])
    assert admitted == {a.message_id: (Admission.NEW, 0)}


async def test_an_attempt_whose_own_transaction_failed_still_counts(inbox):
    a = item()
    assert await inbox.failed_alone(a, "the handler's transaction failed") == 1
    assert await inbox.failed_alone(a, "again") == 2
    assert await lane(inbox, [a], handled) == {a.message_id: (Admission.RETRY, 2)}
    assert await lane(inbox, [a]) == {a.message_id: (Admission.DUPLICATE, 3)}
