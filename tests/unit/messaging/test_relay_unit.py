"""The relay's rules for a row it could not publish, without services: how long it waits (the one
Backoff, from the row's attempts), and which failures are not the row's to wait for; and the key
that keeps an aggregate's messages in order, on a row and on every copy published again."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

from seamq.backoff import Backoff
from seamq.memory import MemoryPublisher
from seamq.memory_outbox import MemoryOutbox
from seamq.model import Event, Header
from seamq.ports import OutboxRow, PubResult
from seamq.relay import Relay, _Marks
from seamq.republish import Copy, repair_copy
from seamq.topology import load_topology


def row(attempts: int) -> OutboxRow:
    return OutboxRow(uuid.uuid4(), "sea", "order", "o-1", "order_placed", 1, "{}", datetime.now(timezone.utc),
                     None, None, None, attempts, 0, None)


def test_a_refused_row_waits_by_its_attempts_a_broker_away_is_not_its_wait_and_a_bad_one_is_parked():
    marks = _Marks(backoff=Backoff(1.0, 30.0))
    for attempts in (0, 3, 40):
        marks.result(row(attempts), PubResult(ok=False, error="stream refused it"))
    marks.result(row(2), PubResult(ok=False, error="no responders", transport=True))
    marks.invalid(row(0), "no stream for context nowhere")
    first, fourth, fortieth, away, parked = marks.fail_delays
    assert 0.5 <= first <= 1.0 and 4.0 <= fourth <= 8.0 and 15.0 <= fortieth <= 30.0  # capped
    assert away is None and parked is None and marks.transport_failed
    assert marks.fail_park == [False, False, False, False, True]


async def test_a_row_and_every_copy_of_it_are_keyed_by_their_aggregate():
    topology, outbox, publisher = load_topology(), MemoryOutbox(), MemoryPublisher()
    relay = Relay(outbox, publisher, SimpleNamespace(wake=asyncio.Event()), topology)
    event = Event(context="sea", aggregate_type="order", aggregate_id="o-1", event_type="order_placed", payload={})
    outbox.add(event)
    await relay.run_once()
    assert [m.key for m in publisher.published] == [("order", "o-1")]
    repaired = repair_copy(topology, row(0)).message()
    assert repaired.key == ("order", "o-1") and repaired.headers[Header.MSG_ID].startswith("repair:")
    bare = Copy("sea.event.order_placed.v1", {}, b"{}", "m-1", msg_id="replay:m-1:1").message()
    assert bare.key is None  # a message with no aggregate waits for nothing
