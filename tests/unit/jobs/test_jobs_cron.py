"""Cron expressions without a server: fields, shorthands, day-of-month OR day-of-week, zones, DST."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from seamq.jobs import cron
from seamq.jobs.model import OjsError

NOW = datetime(2026, 11, 23, 5, 40, 12, tzinfo=timezone.utc)  # a Monday


@pytest.mark.parametrize("expression,zone,expected", [
    ("*/5 * * * *", "UTC", "2026-11-23 05:45"),
    ("@hourly", "UTC", "2026-11-23 06:00"),
    ("@daily", "UTC", "2026-11-24 00:00"),
    ("@weekly", "UTC", "2026-11-29 00:00"),  # Sunday
    ("30 2 * * mon-fri", "UTC", "2026-11-24 02:30"),
    ("0 9 * * *", "Asia/Tokyo", "2026-11-24 00:00"),  # 09:00 JST
    ("0 9 * * *", "America/New_York", "2026-11-23 14:00"),  # 09:00 EST
    ("0 0 1,15 * 7", "UTC", "2026-11-29 00:00"),  # both day fields restricted: either matches
    ("40 5 * * *", "UTC", "2026-11-24 05:40"),  # strictly after now, even within the same minute
])
def test_next_run(expression, zone, expected):
    assert cron.parse(expression).next_after(NOW, zone).strftime("%Y-%m-%d %H:%M") == expected


def test_a_wall_time_that_dst_skips_is_skipped():
    # Europe/Paris jumps from 02:00 to 03:00 on 2027-03-28: 02:30 that day does not exist.
    before = datetime(2027, 3, 27, 12, 0, tzinfo=timezone.utc)
    assert cron.parse("30 2 * * *").next_after(before, "Europe/Paris").strftime("%m-%d %H:%M") == "03-29 00:30"


@pytest.mark.parametrize("expression", ["not a valid cron", "0 0 0 0 0 0 0", "99 25 32 13 8", "*/0 * * * *",
                                        "5-1 * * * *", "* * * * funday", "", None, 7])
def test_invalid_expressions_are_refused_with_a_reason(expression):
    with pytest.raises(OjsError) as refused:
        cron.parse(expression)
    assert refused.value.status == 400 and refused.value.message


def test_unknown_zone_is_refused():
    with pytest.raises(OjsError):
        cron.time_zone("Mars/Olympus")
