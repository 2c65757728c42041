"""The admin API's counters without a server (seamq.jobs.activity): throughput per minute and its
history, kept a day; workers running, quiet, stale and forgotten, by the clock given."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from seamq.jobs.activity import Meter, Workers
from seamq.jobs.model import OjsError

T0 = datetime(2026, 11, 24, 12, 0, 30, tzinfo=timezone.utc)  # half way through a minute


def test_rates_count_this_minute_and_the_part_of_the_last_inside_60_seconds():
    meter = Meter()
    for _ in range(10):
        meter.count("processed", "mail", T0 - timedelta(minutes=1))
    for _ in range(4):
        meter.count("processed", "mail", T0)
    meter.count("failed", "sms", T0)
    assert meter.per_minute(T0) == {"processed_per_minute": 9.0, "failed_per_minute": 1.0}  # 4 + 10 x 0.5
    assert meter.per_minute(T0, "sms") == {"processed_per_minute": 0.0, "failed_per_minute": 1.0}
    assert meter.per_minute(T0 + timedelta(minutes=5)) == {"processed_per_minute": 0.0, "failed_per_minute": 0.0}


def test_history_sums_by_period_and_forgets_after_a_day():
    meter = Meter()
    for minutes in range(12):
        meter.count("enqueued", "mail", T0 + timedelta(minutes=minutes))
    meter.count("processed", "mail", T0 + timedelta(minutes=11))
    history = meter.history("5m", T0, T0 + timedelta(minutes=12), T0 + timedelta(minutes=12))
    assert [(p["enqueued"], p["processed"]) for p in history["data"]] == [(5, 0), (5, 0), (2, 1)]
    assert history["data"][0]["timestamp"] == "2026-11-24T12:00:00.000Z"
    meter.count("processed", "mail", T0 + timedelta(days=1, minutes=5))  # a day on: the old minutes go
    assert sum(sum(c.values()) for c in meter.counts.values()) == 6 + 1 + 1  # minutes 6..11 stay, and the new one
    with pytest.raises(OjsError):
        meter.history("2m", None, None, T0)
    with pytest.raises(OjsError):
        meter.history("1m", T0 - timedelta(days=30), None, T0)  # 43,200 periods


def test_workers_are_running_then_stale_and_forgotten_after_a_day():
    workers = Workers()
    workers.seen("w1", T0, ["mail"])
    workers.seen(None, T0)  # a fetch without a worker id: nobody to list
    assert workers.beat("w1", 2, T0 + timedelta(seconds=10)) is None
    rows, summary = workers.listing(T0 + timedelta(seconds=30))
    assert summary == {"total": 1, "running": 1, "quiet": 0, "stale": 0} and rows[0]["queues"] == ["mail"]
    assert workers.listing(T0 + timedelta(seconds=71))[1]["stale"] == 1
    workers.ask("w1", "quiet")
    assert workers.beat("w1", 0, T0 + timedelta(seconds=80)) == "quiet"
    workers.seen("w2", T0 + timedelta(days=2))  # a new worker a day later: the silent one is forgotten
    assert [r["id"] for r in workers.listing(T0 + timedelta(days=2))[0]] == ["w2"]
