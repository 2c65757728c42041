"""The fault-injection soak, small (the full run is `make soak`, in docs/benchmarks.md): kill -9
of workers, nats-server killed and restarted, PostgreSQL restarted -m immediate, the tables' days
made and dropped under the workers; then counted."""

import json
import pytest
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
def test_small_soak_loses_and_duplicates_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--events", "3000", "--aggregates", "100", "--kill-every", "2",
         "--fault-seconds", "8", "--nats-down", "3", "--quiet-timeout", "240", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "soak-latest.json").read_text())
    faults = [f["fault"] for f in report["faults"]]
    assert "kill -9 nats-server" in faults and "PostgreSQL stopped -m immediate" in faults
    assert report["worker_kills"] >= 2
    assert (report["lost"], report["duplicated"], report["unpublished"], report["missing_from_stream"]) == (0, 0, 0, 0)
    assert report["handled"] == 3000 - 3 and report["poison_dead_lettered"] == 3 == report["poison"]
    assert report["stream_duplicates"] == 0 and report["order_violations_stream"] == 0
    assert report["good_dead_lettered"] == 0, "a good event that failed once never reaches the DLQ"
    # Days made and dropped under the workers: the rows the made day covers moved out of the default
    # partition (half the events), the dropped days' history gone.
    assert report["days_made"] >= 3 and report["days_dropped"] >= 2
    assert report["rows_left_in_default"] == 0 and report["history_rows_left"] == 0


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
def test_small_soak_with_partitioned_consumers_keeps_each_aggregates_order(tmp_path):
    """The same faults, the consumer in 4 partitions: now also no aggregate handled out of order."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--events", "3000", "--aggregates", "100", "--kill-every", "2",
         "--fault-seconds", "8", "--nats-down", "3", "--quiet-timeout", "240", "--partitions", "4", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "soak-latest.json").read_text())
    assert report["partitions"] == 4 and report["worker_kills"] >= 2
    assert (report["lost"], report["duplicated"], report["unpublished"], report["missing_from_stream"]) == (0, 0, 0, 0)
    assert report["handled"] == 3000 - 3 and report["poison_dead_lettered"] == 3 == report["poison"]
    assert report["order_violations_stream"] == 0 and report["order_violations_handling"] == 0
