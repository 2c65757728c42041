"""kill -9 of `seamq jobs serve` and of nats-server with 1,000 jobs in mixed states, then both restarted.

Before the crash: 250 jobs available, 250 active (half of them acked: completed), 250 scheduled and
250 retryable, the last two due while everything is down, the active ones' leases too. After the
restart a worker drains every queue. Counted: every job completed, none lost, no acked job fetched
again, and the timers that fell due in the outage fired after the restart (no job ran before it).
NATS goes first: while it is away, the server's health answers 503 (a load balancer's readiness).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import aiohttp

from seamq.embedded import NatsServer
from seamq.jobs.client import JobsClient

from helpers.jobs_harness import JobServer

QUARTER = 250
QUEUES = ["available", "active", "scheduled", "retryable"]
# Seconds the jobs fetched before the crash are leased, and the failed ones back off: the set-up
# must finish before either runs out, and on a busy machine its 250 acks and nacks took 17 s.
LEASE = 30.0
RETRY = {"max_attempts": 5, "initial_interval": "PT30S", "backoff_coefficient": 1.0, "jitter": False}


def batch(queue: str, count: int, **options) -> list[dict]:
    return [{"type": "test.restart", "args": [queue, n], "options": {"queue": queue, "retry": RETRY, **options}}
            for n in range(count)]


async def drain(client: JobsClient, want: set[str], seconds: float) -> list[str]:
    """Fetch and ack until every wanted job is completed; returns every id fetched, repeats included."""
    fetched: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        jobs = await client.fetch(QUEUES, count=50, worker_id="after")
        for job in jobs:
            fetched.append(job["id"])
            await client.ack(job["id"], {"ok": True})
        if not jobs:
            states = await asyncio.gather(*(client.info(job_id) for job_id in want))
            if all(job["state"] == "completed" for job in states):
                return fetched
            await asyncio.sleep(0.2)
    raise AssertionError(f"not every job completed in {seconds} s")


async def health_while_nats_is_away(url: str) -> tuple[int, str]:
    """What the server's health says once it has lost NATS; a push meanwhile is refused with OJS's
    backend codes (a client tries again, at this server or another), never a bare 500."""
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"{url}/ojs/v1/health") as answer:
                if answer.status != 200 or time.monotonic() > deadline:
                    health = answer.status, (await answer.json())["status"]
                    break
            await asyncio.sleep(0.1)
        async with http.post(f"{url}/ojs/v1/jobs", json={"type": "t.away", "args": []}) as answer:
            refused = answer.status, (await answer.json())["error"]["code"]
    assert refused in ((503, "backend_unavailable"), (504, "backend_timeout")), refused
    return health


async def test_kill_9_of_server_and_nats_loses_no_job_and_runs_no_acked_job_again(tmp_path):
    nats = NatsServer(tmp_path / "nats")
    nats.start()
    server = JobServer(nats.url, tmp_path / "server.log")
    try:
        server.start()
        async with JobsClient(server.url) as client:
            # Far enough ahead for the set-up to finish before them on a busy machine (its 125 acks took
            # over 2 s there, and the leases ran out under them); the outage below waits them out.
            due = (datetime.now(timezone.utc) + timedelta(seconds=LEASE)).isoformat()
            ids: dict[str, list[str]] = {}
            for queue, options in [("available", {}), ("active", {}), ("retryable", {}),
                                   ("scheduled", {"scheduled_at": due})]:
                ids[queue] = [job["id"] for job in await client.push_batch(batch(queue, QUARTER, **options))]
            leases_end = time.monotonic() + LEASE
            active = await client.fetch(["active"], count=QUARTER, worker_id="before",
                                        visibility_timeout_ms=int(LEASE * 1000))
            failing = await client.fetch(["retryable"], count=QUARTER, worker_id="before")
            assert len(active) == len(failing) == QUARTER
            acked = {job["id"] for job in active[: QUARTER // 2]}
            await asyncio.gather(*(client.ack(job_id, {"before": True}) for job_id in acked))
            await asyncio.gather(*(client.nack(job["id"], {"type": "Boom", "message": "fails before the crash"})
                                   for job in failing))
            backoffs_end = time.monotonic() + LEASE
            sample = {queue: ids[queue][:: QUARTER // 10] for queue in ids}  # ten of each, asked at once
            before = {queue: {job["state"] for job in await asyncio.gather(*map(client.info, sample[queue]))}
                      for queue in ids}
        assert before == {"available": {"available"}, "active": {"active", "completed"},
                          "scheduled": {"scheduled"}, "retryable": {"retryable"}}

        nats.kill()
        assert await health_while_nats_is_away(server.url) == (503, "degraded")  # out of a load balancer's pool
        server.kill()
        assert "Traceback" not in server.log()
        crashed_at = datetime.now(timezone.utc)
        assert crashed_at < datetime.fromisoformat(due), "the scheduled jobs must fall due in the outage"
        # Schedules, backoffs and leases all fall due while nothing runs.
        await asyncio.sleep(max(datetime.fromisoformat(due).timestamp() - time.time(),
                                leases_end - time.monotonic(), backoffs_end - time.monotonic(), 0) + 1.0)
        nats.start()
        server.start()

        async with JobsClient(server.url) as client:
            every = {job_id for queue in ids.values() for job_id in queue}
            fetched = await drain(client, every, 120)
            jobs = {job_id: await client.info(job_id) for job_id in every}
    finally:
        server.kill()
        nats.kill()

    assert len(every) == 4 * QUARTER
    assert {job["state"] for job in jobs.values()} == {"completed"}, "every job terminal, none lost"
    assert not acked & set(fetched), "a job acked before the crash ran again"
    assert set(fetched) == every - acked
    assert len(fetched) == len(set(fetched)), "a job was handed out twice after the restart"
    for job_id in ids["scheduled"] + ids["retryable"] + sorted(set(ids["active"]) - acked):
        started = datetime.fromisoformat(jobs[job_id]["started_at"])
        assert started > crashed_at, "a timer that fell due in the outage fired after the restart"
    assert {jobs[job_id]["attempt"] for job_id in ids["retryable"]} == {2}
    assert {jobs[job_id]["result"].get("before") for job_id in acked} == {True}
