"""Delivery KPIs on a synthetic outbox/inbox with known answers."""

from __future__ import annotations

import json
from datetime import datetime

import psycopg
import pytest

pytest.importorskip("pyspark")
np = pytest.importorskip("numpy")

from helpers.pipeline import seed  # noqa: E402


def test_kpis_on_known_data(spark, dsn, tmp_path):
    from seamq.pipeline.kpis import compute, summary, write_report

    seed(dsn)
    rows = compute(spark, dsn).collect()
    by_context = {r.context: r for r in rows}
    assert set(by_context) == {"sea", "vibespro"} and len(rows) == 2
    sea = by_context["sea"]
    assert sea.hour == datetime(2026, 11, 20, 10)  # the session's time zone is UTC
    assert (sea.outbox_total, sea.published, sea.inbox_total) == (10000, 9990, 1000)
    assert sea.delivery_rate == pytest.approx(0.999, abs=1e-12)
    assert sea.duplicate_rate == pytest.approx(0.01, abs=1e-12)
    assert sea.dlq_rate == pytest.approx(0.005, abs=1e-12)
    latencies = np.arange(1, 996, dtype=float)
    for field, q in (("e2e_p50_ms", 50), ("e2e_p95_ms", 95), ("e2e_p99_ms", 99)):
        assert getattr(sea, field) == pytest.approx(np.percentile(latencies, q), rel=0.01), field
    lags = np.array([i % 100 for i in range(1, 9991)], dtype=float)
    assert sea.relay_lag_p50_ms == pytest.approx(np.percentile(lags, 50), rel=0.01)
    assert sea.relay_lag_p99_ms == pytest.approx(np.percentile(lags, 99), rel=0.01)

    vibespro = by_context["vibespro"]  # its delayed events count from deliver_at: not an hour late
    assert (vibespro.e2e_p99_ms, vibespro.relay_lag_p99_ms) == (pytest.approx(10, rel=1e-3), pytest.approx(2, rel=1e-3))

    report = summary(rows)
    assert report["contexts"]["sea"]["breaches"] == ["delivery_rate", "duplicate_rate", "dlq_rate", "p99_latency"]
    assert report["contexts"]["vibespro"]["breaches"] == []
    page = write_report(rows, report, tmp_path / "kpis")
    assert "<svg" in page.read_text() and "sea.order_placed" in page.read_text()
    assert json.loads((tmp_path / "kpis" / "summary.json").read_text())["contexts"]["sea"]["published"] == 9990


def test_kpis_command_writes_parquet_json_and_html(dsn, tmp_path):
    import subprocess

    from helpers import SEAMQ

    seed(dsn)
    out = tmp_path / "kpis"
    result = subprocess.run([*SEAMQ, "pipeline", "kpis", "--out", str(out), "--master", "local[1]"],
                            env={**__import__("os").environ, "SEAMQ_DATABASE_URL": dsn},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "delivery_rate" in result.stdout and "none" in result.stdout  # sea breaches, vibespro none
    assert (out / "report.html").exists() and (out / "kpis.parquet").exists()
    assert json.loads((out / "summary.json").read_text())["contexts"]["vibespro"]["breaches"] == []


def test_time_ranges_cover_the_window_once():
    from datetime import timedelta, timezone

    from seamq.pipeline.pg_source import split

    lo = datetime(2026, 11, 20, 10, tzinfo=timezone.utc)
    for hi, parts in ((lo + timedelta(hours=1), 7), (lo + timedelta(microseconds=3), 8), (lo, 4)):
        ranges = [tuple(datetime.fromisoformat(v) for v in r.value) for r in split(lo, hi, parts)]
        assert len(ranges) == min(parts, (hi - lo) // timedelta(microseconds=1))
        if ranges:
            assert ranges[0][0] == lo and ranges[-1][1] == hi and all(a < b for a, b in ranges)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous: no gap, no overlap


def test_kpis_of_a_window_read_in_parallel_ranges_match_the_whole(spark, dsn):
    """Rows on both sides of the window's edges, and (60 ranges of a minute) on every range's edge:
    the window's KPIs equal the whole run's row for that hour, however many ranges are read."""
    from datetime import timezone

    from seamq.pipeline.kpis import compute

    seed(dsn)
    with psycopg.connect(dsn) as conn:  # the hour before and after, and the edges themselves
        conn.execute("""
            INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload,
                                       occurred_at, created_at, published_at)
            SELECT gen_random_uuid(), 'sea', 'order', 'o', 'order_placed', '{}', t, t, t
            FROM unnest(ARRAY['2026-11-20 09:59:59.999999+00', '2026-11-20 11:00:00+00',
                              '2026-11-20 11:30:00+00']::timestamptz[]) AS t""")
    since = datetime(2026, 11, 20, 10, tzinfo=timezone.utc)
    until = datetime(2026, 11, 20, 11, tzinfo=timezone.utc)
    whole = {(r.context, r.hour): r for r in compute(spark, dsn).collect()}
    assert len(whole) == 4  # sea 09h, 10h, 11h; vibespro 10h
    for partitions in (1, 60):
        window = compute(spark, dsn, since, until, partitions=partitions).collect()
        assert [(r.context, r.hour.hour) for r in window] == [("sea", 10), ("vibespro", 10)]
        for row in window:
            assert row == whole[(row.context, row.hour)]


def test_the_database_password_stays_out_of_spark_plans(spark, dsn, capsys):
    from seamq.pipeline import pg_source

    secret_dsn = dsn.replace("postgres@", "postgres:s3cr3t-pw@")  # trust auth: accepted, never checked
    frame = pg_source.read(spark, secret_dsn, "outbox_kpis", partitions=2)
    assert frame.count() == 0
    frame.explain("extended")
    frame.explain("formatted")
    plan = capsys.readouterr().out
    assert "seamq_pg" in plan and "s3cr3t-pw" not in plan
