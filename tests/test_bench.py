"""The benchmark harness in quick mode: it runs and reports every scenario (no timing asserts)."""

import json
import pytest
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
def test_quick_bench_runs_every_scenario(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    scenarios = {s["scenario"]: s for s in report["scenarios"]}
    assert set(scenarios) == {"relay", "relay_latency", "producer_commits", "consumer", "e2e", "delayed", "http", "spark",
                              "peer", "jobs", "floors"}
    for scenario in scenarios.values():
        assert scenario["rows"], scenario["scenario"]
        for row in scenario["rows"]:
            rate = (row.get("jobs_per_s") or row.get("events_per_s") or row.get("msgs_per_s")
                    or row.get("achieved_per_s") or row.get("rows_per_s") or row.get("commits_per_s"))
            assert rate and rate > 0, (scenario["scenario"], row)
    assert report["machine"]["cores"] >= 1
