"""The benchmark harness in quick mode: it runs and reports every scenario (no timing asserts)."""

import json
import pytest
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(1800)  # its own limit: a long run on a busy machine is no hang
def test_quick_bench_runs_every_scenario(tmp_path):
    # Five minutes of CPU alone; beside the Spark tests on two busy cores, three times that.
    result = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=1700)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    scenarios = {s["scenario"]: s for s in report["scenarios"]}
    assert set(scenarios) == {"relay", "relay_latency", "producer_commits", "relay_history", "retention", "tables_at_scale", "consumer", "e2e", "delayed", "http", "spark",
                              "peer", "peers_relay", "peers_relay_latency", "jobs", "peers_jobs", "floors",
                              "summary"}
    assert report["scenarios"][0]["scenario"] == "summary"  # where seamq stands leads the report
    measures = " | ".join(row["measure"] for row in scenarios.pop("summary")["rows"])
    for stage in ("relay events/s vs the fastest outbox peer", "FastStream", "jobs processed/s vs PgQueuer",
                  "HTTP mode: consumer CPU per message", "p99 commit -> handler at 2k",
                  "relay catch-up with"):
        assert stage in measures, measures
    for scenario in scenarios.values():
        assert scenario["rows"], scenario["scenario"]
        for row in scenario["rows"]:
            if row.get("not_run"):  # only Oban, which needs a Python >= 3.12 the machine may not have
                assert row["case"].startswith("Oban"), row
                continue
            rate = (row.get("jobs_per_s") or row.get("events_per_s") or row.get("msgs_per_s") or row.get("processed")
                    or row.get("achieved_per_s") or row.get("rows_per_s") or row.get("commits_per_s"))
            assert rate and rate > 0, (scenario["scenario"], row)
    peers = {row["case"].split()[0] for row in scenarios["peers_relay"]["rows"] + scenarios["peers_jobs"]["rows"]}
    assert {"seamq", "faststream-outbox", "nats-outbox", "procrastinate", "PgQueuer", "saq", "arq"} <= peers
    assert report["machine"]["cores"] >= 1
    took = report["seconds_per_scenario"]  # where the run's time went, each scenario with its services
    assert list(took) == ["relay", "history", "retention", "scale", "consumer", "e2e", "delayed", "http", "spark", "peer",
                          "peers_relay", "jobs", "peers_jobs", "floors"], took
    assert all(seconds > 0 for seconds in took.values()), took
