"""The outbox port (seamq.ports.OutboxRepository): what every outbox must do for the relay, checked
against each, as River's drivers pass one shared suite. Rows are written as producers write them
(`seamq.outbox.add` in a committed transaction; the in-memory outbox's `add`, which checks an event
the same way); each case then asks only what the port answers. The in-memory outbox
(seamq.memory_outbox) is what the relay's unit tier runs on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

from helpers import wait_for
from seamq.memory_outbox import MemoryOutbox
from seamq.model import Event


@dataclass
class Store:
    write: Callable[..., Any]  # (events, deliver_at=None): committed rows
    outbox: Any  # the OutboxRepository


@pytest.fixture
async def store(database):
    if database is None:
        memory = MemoryOutbox()

        def write(events, deliver_at=None):
            for e in events:
                memory.add(e, deliver_at=deliver_at)
        yield Store(write, memory)
        return
    import psycopg

    from seamq.outbox import add
    from seamq.pg.outbox_repo import PgOutbox, relay_session
    from seamq.wiring import pg_pool

    def write(events, deliver_at=None):
        with psycopg.connect(database) as conn, conn.transaction():
            for e in events:
                add(conn, e, deliver_at=deliver_at)
    async with pg_pool(database, configure=relay_session) as pool:
        yield Store(write, PgOutbox(pool))


def events(aggregate: str, n: int) -> list[Event]:
    return [Event("sea", "order", aggregate, "order_placed", {"n": i}) for i in range(n)]


async def claim(store: Store, limit: int = 100, publish: bool = True) -> list:
    """One claim; its rows published (stream seqs 1..n) unless `publish` is off."""
    async with store.outbox.claim(limit) as batch:
        if publish:
            await batch.mark_published([r.id for r in batch.rows], list(range(1, len(batch.rows) + 1)))
        return batch.rows


async def test_rows_come_in_write_order_per_aggregate_and_once_published_never_again(store):
    a, b = events("o-1", 3), events("o-2", 2)
    store.write([a[0], b[0], a[1], b[1], a[2]])
    rows = await claim(store)
    assert [r.id for r in rows] == [a[0].id, b[0].id, a[1].id, b[1].id, a[2].id]
    first = rows[0]
    assert (first.context, first.aggregate_type, first.aggregate_id, first.event_type, first.event_version,
            first.publish_attempts, first.deliver_at) == ("sea", "order", "o-1", "order_placed", 1, 0, None)
    assert first.payload.replace(" ", "") == '{"n":0}' and first.traceparent
    assert len({r.bucket for r in rows if r.aggregate_id == "o-1"}) == 1  # one aggregate, one bucket
    assert await claim(store) == []
    assert await store.outbox.backlog() == []


async def test_a_claim_that_fails_or_marks_nothing_leaves_its_rows_to_the_next(store):
    store.write(events("o-1", 2))
    with pytest.raises(RuntimeError):
        async with store.outbox.claim(100) as batch:
            await batch.mark_published([r.id for r in batch.rows], [1, 2])
            raise RuntimeError("the relay died before its commit")
    assert len(await claim(store, publish=False)) == 2
    assert [r.publish_attempts for r in await claim(store)] == [0, 0]


async def test_an_aggregate_held_by_a_running_claim_goes_to_no_other_meanwhile(store):
    store.write(events("o-1", 2))
    async with store.outbox.claim(100) as first:
        assert len(first.rows) == 2
        async with store.outbox.claim(100) as second:
            assert second.rows == [] and second.more, "pending work left to the other relay is said"
        await first.mark_published([r.id for r in first.rows], [1, 2])
    assert await claim(store) == []


async def test_a_failed_row_waits_its_delay_and_its_aggregate_waits_behind_it(store):
    # Delays of an hour and of a moment: what must wait is seen to wait however slow the machine is.
    slow, quick, other = events("o-1", 2), events("o-3", 2), events("o-2", 1)
    store.write([slow[0], quick[0], other[0], slow[1], quick[1]])
    async with store.outbox.claim(100) as batch:
        await batch.mark_failed([slow[0].id, quick[0].id], ["stream refused it", "stream refused it"], [3600, 0.2])
        await batch.mark_published([other[0].id], [1])
    [row] = await store.outbox.backlog()
    assert (row.context, row.count, row.failing, row.delayed, row.parked) == ("sea", 4, 2, 0, 0)

    async def quick_ones():
        return await claim(store)
    rows = await wait_for(quick_ones, what="the row failed for a moment, claimed again")
    assert [(r.id, r.publish_attempts) for r in rows] == [(quick[0].id, 1), (quick[1].id, 0)]
    assert await claim(store) == []  # o-1's first row waits its hour, and its second behind it


async def test_a_row_failed_without_a_delay_of_its_own_is_claimed_again_at_once(store):
    store.write(events("o-1", 1))
    async with store.outbox.claim(100) as batch:
        await batch.mark_failed([batch.rows[0].id], ["no responders"], [None])
    assert [r.publish_attempts for r in await claim(store)] == [1]


async def test_a_parked_row_is_never_claimed_and_is_counted_apart(store):
    a = events("o-1", 2)
    store.write(a)
    async with store.outbox.claim(100) as batch:
        await batch.mark_failed([a[0].id], ["no stream for context sea"], [None], park=[True])
    assert await claim(store) == []  # its aggregate waits behind it: a person decides (seamq outbox parked)
    [row] = await store.outbox.backlog()
    assert (row.count, row.parked, row.failing) == (1, 1, 0)


async def test_a_parked_row_is_listed_with_why_handed_back_under_another_context_or_dropped(store):
    typo = [Event("shopp", "order", "o-1", "order_placed", {"n": i}) for i in range(3)]
    store.write(typo + events("o-2", 1))
    async with store.outbox.claim(100) as batch:
        await batch.mark_failed([e.id for e in typo], ["no stream for context shopp"] * 3, [None] * 3, park=[True] * 3)
        await batch.mark_published([batch.rows[-1].id], [1])
    listed = await store.outbox.parked("shopp", None, 100)
    assert [(r.id, r.context, r.parked_reason) for r in listed] == [(e.id, "shopp", "no stream for context shopp")
                                                                    for e in typo]
    assert await store.outbox.parked("sea", None, 100) == [] and len(await store.outbox.parked(None, typo[1].id, 9)) == 1
    assert await store.outbox.drop_parked(None, typo[2].id) == 1
    assert await store.outbox.unpark("shopp", None, to="sea") == 2
    assert await store.outbox.parked(None, None, 100) == [] and await store.outbox.unpark("shopp", None) == 0
    rows = await claim(store)
    assert [(r.id, r.context, r.publish_attempts) for r in rows] == [(e.id, "sea", 1) for e in typo[:2]]
    assert await store.outbox.backlog() == []


async def test_a_delayed_row_is_held_until_released_and_holds_no_other_row_back(store):
    later, soon, now = events("o-1", 1), events("o-1", 1), events("o-1", 1)
    store.write(later, deliver_at=datetime.now(timezone.utc) + timedelta(hours=1))
    store.write(soon, deliver_at=datetime.now(timezone.utc) + timedelta(seconds=0.3))
    store.write(now)
    async with store.outbox.claim(100) as batch:
        assert [r.id for r in batch.rows] == [now[0].id]  # not behind its aggregate's delayed rows
        assert batch.next_due is not None and batch.next_due <= 0.3  # the sooner one's
        await batch.mark_published([now[0].id], [1])
    [row] = await store.outbox.backlog()
    assert (row.count, row.delayed) == (0, 2)
    released = 0

    async def the_soon_one_released():
        nonlocal released
        released += await store.outbox.release_due()
        return released
    await wait_for(the_soon_one_released, what="the delayed row released once due")
    assert released == 1 and await store.outbox.release_due() == 0  # the hour's row stays held
    [row] = await claim(store)
    assert row.id == soon[0].id and row.deliver_at is not None
    [row] = await store.outbox.backlog()
    assert (row.count, row.delayed) == (0, 1)
