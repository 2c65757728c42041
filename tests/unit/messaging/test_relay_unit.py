"""The relay's rules for a row it could not publish, without services: how long it waits (the one
Backoff, from the row's attempts), and which failures are not the row's to wait for."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from seamq.backoff import Backoff
from seamq.ports import OutboxRow, PubResult
from seamq.relay import _Marks


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
