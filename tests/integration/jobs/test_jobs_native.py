"""`seamq jobs worker --nats`: the engine in the worker's own process (seamq.jobs.native), beside a job
server and an HTTP worker on the same queue, one native worker killed -9 mid-run.

Counted afterwards from what each run wrote as it started and ended: every job completed, each run
of a job after another one's end (never two at once: leases hold across processes), a job run again
only after a failed attempt or a run the kill cut short, every worker having done its share, and the
queue's counts exact although the native workers' claims leave their counts to the job's next change.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path

from seamq.jobs.client import JobsClient
from seamq.jobs.model import STATES
from seamq.jobs import beats, recounts
from seamq.jobs.native import EngineClient, started_engine
from seamq.jobs.queues import Queues

from helpers.jobs_harness import JobServer, push_numbered, runs_of, start_worker

JOBS = 400
RETRY = {"max_attempts": 3, "initial_interval": "PT0.3S", "jitter": False}
LEASE = 10  # seconds: the killed worker's jobs come back to the others this long after it dies


def start(how: list[str], nats_url: str, effects: Path, log: Path) -> subprocess.Popen:
    return start_worker(how, queue="native", handler="span", effects=effects, log=log, nats_url=nats_url,
                        extra=("--visibility-timeout", str(LEASE)))


def ended(path: Path, pid: int | None = None) -> int:
    """Jobs with a run that ended (in process `pid`, when given)."""
    return sum(any(r["how"] == "end" and pid in (None, r["pid"]) for r in rs) for rs in runs_of(path).values())


async def test_native_workers_beside_a_server_run_each_job_once_at_a_time_through_a_kill(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    effects = tmp_path / "runs.txt"
    workers: dict[str, subprocess.Popen] = {}
    try:
        async with JobsClient(server.url) as client:
            ids = await push_numbered(client, JOBS, "test.span", {"queue": "native", "retry": RETRY})
            # The one to be killed starts alone, so it has a share of its own whatever the machine's speed.
            workers["native-a"] = start(["--nats"], nats_server.url, effects, tmp_path / "native-a.log")
            victim = workers["native-a"].pid
            while ended(effects, victim) < 10:
                await asyncio.sleep(0.05)
                assert workers["native-a"].poll() is None, (tmp_path / "native-a.log").read_text()
            for name, how in (("http", ["--url", server.url]), ("native-b", ["--nats"])):
                workers[name] = start(how, nats_server.url, effects, tmp_path / f"{name}.log")
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
            counts = next(q["counts"] for q in await client.queues() if q["name"] == "native")
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            await asyncio.to_thread(worker.wait, 30)
        server.stop()

    assert {job["state"] for job in jobs} == {"completed"}, [j["id"] for j in jobs if j["state"] != "completed"]
    # The killed worker's claims left their counts as available; the claims after its leases moved them.
    assert {s: counts[s] for s in STATES} == {**dict.fromkeys(STATES, 0), "completed": JOBS}, counts
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


async def _stats_when(engine, queue: str, done) -> dict:
    for _ in range(200):  # a liveness bound only
        if done(stats := await Queues(engine.store).stats(queue)):  # as another server reads them
            return stats
        await asyncio.sleep(0.05)
    return stats


@asynccontextmanager
async def one_claimed(url: str, queue: str):
    """An engine as a native worker runs it, its client, and one job of `queue` it claimed."""
    import nats

    nc = await nats.connect(url)
    engine = await started_engine(nc)
    try:
        client = EngineClient(engine)
        await engine.ops.push({"type": "test.quick", "args": [], "options": {"queue": queue}})
        [job] = await client.fetch([queue], count=1, worker_id="w")
        yield engine, client, job
    finally:
        await engine.stop()
        await nc.close()


async def acked_counts(engine, client: EngineClient, job: dict) -> tuple[int, int, int]:
    """(available, active, completed) of the job's queue once its ack is counted."""
    await client.ack(job["id"], None)
    stats = await _stats_when(engine, job["queue"], lambda s: s["completed"] == 1)
    return stats["available"], stats["active"], stats["completed"]


async def test_a_native_claim_moves_no_count_and_its_ack_moves_it_from_available(nats_server, monkeypatch):
    """The claim is one plain write: the job stays counted as available until its ack, which counts it
    completed. (The recount is held off here, so that a slow machine cannot fire it first.)"""
    monkeypatch.setattr(recounts, "COUNTED_AFTER", 3600.0)
    async with one_claimed(nats_server.url, "uncounted") as (engine, client, job):
        stats = await Queues(engine.store).stats("uncounted")  # as another server reads them: no recount first
        assert (stats["available"], stats["active"]) == (1, 0), stats
        assert await acked_counts(engine, client, job) == (0, 0, 1)


async def test_a_job_a_native_worker_runs_is_counted_as_active_once_it_has_run_a_moment(nats_server):
    """COUNTED_AFTER after its claim a running job is counted as active, and its ack counts it completed."""
    async with one_claimed(nats_server.url, "counted") as (engine, client, job):
        stats = await _stats_when(engine, "counted", lambda s: s["active"] == 1)
        assert (stats["available"], stats["active"]) == (0, 1), stats
        assert await acked_counts(engine, client, job) == (0, 0, 1)


async def test_acks_said_together_each_get_their_own_answer(nats_server):
    """Acks said in one turn are stored together (seamq.jobs.completions); one whose job another server
    wrote meanwhile is read again, and each gets its own answer: completed, or the refusal `ack` gives."""
    import nats

    from seamq.jobs.client import JobsError

    nc = await nats.connect(nats_server.url)
    engine, other = await started_engine(nc), await started_engine(nc)  # `other`: another server on the queue
    try:
        client = EngineClient(engine)
        for n in range(4):
            await engine.ops.push({"type": "test.quick", "args": [n], "options": {"queue": "together"}})
        plain, extended, cancelled, twice = await client.fetch(["together"], count=4, worker_id="w")
        await beats.heartbeat(other.ops, "w", [extended["id"]])  # the copy kept here is one revision behind
        await other.ops.cancel(cancelled["id"])
        missing = "019ae4a1-0000-7000-8000-000000000000"
        said = [client.ack_soon(job["id"], {"n": n}) for n, job in enumerate((plain, extended, cancelled, twice))]
        said += [client.ack_soon(twice["id"]), client.ack_soon(missing)]
        answers = await asyncio.gather(*said, return_exceptions=True)
        shown = [a["state"] if isinstance(a, dict) else a.status for a in answers]
        assert shown[:3] + shown[5:] == ["completed", "completed", 409, 404], answers
        assert sorted(shown[3:5], key=str) == [409, "completed"], answers  # one of the two, whichever came first
        assert answers[1]["result"] == {"n": 1}
        stats = await _stats_when(engine, "together", lambda s: s["completed"] == 3)
        assert {k: stats[k] for k in ("available", "active", "completed", "cancelled")} == {
            "available": 0, "active": 0, "completed": 3, "cancelled": 1}, stats
        assert all(isinstance(a, JobsError) for a in answers if not isinstance(a, dict))
    finally:
        await other.stop()
        await engine.stop()
        await nc.close()
