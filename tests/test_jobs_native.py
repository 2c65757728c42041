"""`seamq jobs worker --nats`: the engine in the worker's own process (seamq.jobs.native), beside a job
server and an HTTP worker on the same queue, one native worker killed -9 mid-run.

Counted afterwards from what each run wrote as it started and ended: every job completed, each run
of a job after another one's end (never two at once: leases hold across processes), a job run again
only after a failed attempt or a run the kill cut short, and every worker having done its share.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from seamq.jobs.client import JobsClient

from jobs_harness import JobServer

JOBS = 400
RETRY = {"max_attempts": 3, "initial_interval": "PT0.3S", "jitter": False}
LEASE = 10  # seconds: the killed worker's jobs come back to the others this long after it dies


def start_worker(how: list[str], nats_url: str, effects: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "JOBS_TEST_EFFECTS": str(effects), "PYTHONPATH": str(Path(__file__).parent),
           "SEAMQ_NATS__URL": nats_url}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "seamq", "jobs", "worker", *how, "--queue", "native",
                                 "--handler", "jobs_handlers:span", "--concurrency", "8",
                                 "--visibility-timeout", str(LEASE), "--grace", "20"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def runs_of(path: Path) -> dict[str, list[dict]]:
    """Each job's runs: start, how it ended (end, fail, or None when cut short), by which process."""
    runs: dict[str, list[dict]] = defaultdict(list)
    lines = path.read_text().splitlines() if path.exists() else []
    for what, job_id, attempt, pid, at in (line.split() for line in lines if len(line.split()) == 5):
        if what == "start":
            runs[job_id].append({"attempt": int(attempt), "pid": int(pid), "start": float(at), "end": None,
                                 "how": None})
        else:
            run = next(r for r in runs[job_id] if r["attempt"] == int(attempt) and r["pid"] == int(pid))
            run.update(end=float(at), how=what)
    return runs


def ended(path: Path, pid: int | None = None) -> int:
    """Jobs with a run that ended (in process `pid`, when given)."""
    return sum(any(r["how"] == "end" and pid in (None, r["pid"]) for r in rs) for rs in runs_of(path).values())


async def test_native_workers_beside_a_server_run_each_job_once_at_a_time_through_a_kill(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    effects = tmp_path / "runs.txt"
    workers: dict[str, subprocess.Popen] = {}
    try:
        async with JobsClient(server.url) as client:
            ids = []
            for start in range(0, JOBS, 100):
                batch = [{"type": "test.span", "args": [n], "options": {"queue": "native", "retry": RETRY}}
                         for n in range(start, start + 100)]
                ids += [job["id"] for job in await client.push_batch(batch)]
            # The one to be killed starts alone, so it has a share of its own whatever the machine's speed.
            workers["native-a"] = start_worker(["--nats"], nats_server.url, effects, tmp_path / "native-a.log")
            victim = workers["native-a"].pid
            while ended(effects, victim) < 10:
                await asyncio.sleep(0.05)
                assert workers["native-a"].poll() is None, (tmp_path / "native-a.log").read_text()
            for name, how in (("http", ["--url", server.url]), ("native-b", ["--nats"])):
                workers[name] = start_worker(how, nats_server.url, effects, tmp_path / f"{name}.log")
            while ended(effects) < 100:  # the kill comes mid-run
                await asyncio.sleep(0.05)
                assert all(w.poll() is None for w in workers.values()), {n: (tmp_path / f"{n}.log").read_text()
                                                                         for n in workers}
            killed = victim
            workers["native-a"].send_signal(signal.SIGKILL)
            killed_at = time.time()
            for _ in range(2400):  # a liveness bound only
                if ended(effects) >= JOBS:
                    break
                await asyncio.sleep(0.05)
            jobs = [await client.info(job_id) for job_id in ids]
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            await asyncio.to_thread(worker.wait, 30)
        server.stop()

    assert {job["state"] for job in jobs} == {"completed"}, [j["id"] for j in jobs if j["state"] != "completed"]
    runs = runs_of(effects)
    assert sorted(runs) == sorted(ids)
    for job_id, job_runs in runs.items():
        job_runs.sort(key=lambda r: r["start"])
        for before, after in zip(job_runs, job_runs[1:]):
            over = before["end"] if before["end"] is not None else killed_at
            assert before["how"] == "fail" or before["pid"] == killed, ("run again for no reason", job_id, job_runs)
            assert after["start"] >= over, ("two runs at once", job_id, job_runs)
        assert sum(r["how"] == "end" for r in job_runs if r["pid"] != killed) <= 1, ("completed twice", job_runs)
    pids = {r["pid"] for rs in runs.values() for r in rs if r["how"] == "end"}
    assert {workers["http"].pid, workers["native-b"].pid, killed} <= pids, "every worker did its share"
    for name in ("http", "native-b"):  # an ack or a nack refused: a lease lost while its job ran
        assert "job_settle" not in (tmp_path / f"{name}.log").read_text(), name
