"""Fairness between tenants (OJS multi-tenancy's hybrid model, fair scheduling's per-tenant fairness)
across three job servers and native workers on one queue.

Tenant `big` enqueues ten times the jobs of tenant `small`, all of `big`'s first, then a worker per
server (over HTTP) and two `--nats` ones start. docs/jobs.md's bound: while k tenants have jobs
waiting at a priority, each fetch gives each of them a share (a fetch of n jobs, at least n/k each
when they have as many), so a tenant's i-th job starts among the queue's first k * i starts, give
or take one fetch per worker. Counted from the jobs' `started_at`: `small`'s first job among the
first fetches, its last by the 2 * 100 + 5 * 8 -th start (five workers fetching 8 at most), and a
fetch for one tenant (`X-OJS-Tenant`) never handed another's job.
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp

from seamq.jobs.client import JobsClient
from seamq.jobs.model import parse_time

from helpers.jobs_harness import JobServer, running, start_beside, start_worker, stopped

BIG, SMALL, WORKERS, AT_ONCE = 1000, 100, 5, 8


async def push(client: JobsClient, tenant: str, count: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 100):
        batch = [{"type": "test.paced", "args": [n, 0.0], "options": {"queue": "shared"}, "meta": {"tenant_id": tenant}}
                 for n in range(start, min(start + 100, count))]
        ids += [job["id"] for job in await client.push_batch(batch)]
    return ids


async def test_a_tenant_with_a_tenth_of_the_jobs_is_not_held_back_by_the_other(nats_server, tmp_path):
    servers = [JobServer(nats_server.url, tmp_path / f"server-{n}.log").start() for n in range(3)]
    workers = []
    try:
        async with JobsClient(servers[0].url) as client:
            big = await push(client, "big", BIG)
            small = await push(client, "small", SMALL)
            async with aiohttp.ClientSession() as http:  # a fetch for one tenant gets its jobs alone
                async with http.post(f"{servers[2].url}/ojs/v1/workers/fetch", headers={"X-OJS-Tenant": "small"},
                                     json={"queues": ["shared"], "count": 3, "worker_id": "probe"}) as answer:
                    probed = (await answer.json())["jobs"]
            assert len(probed) == 3 and {j["meta"]["tenant_id"] for j in probed} == {"small"}
            for job in probed:
                await client.ack(job["id"], None)
            workers = start_beside(servers, nats_server.url, tmp_path, queue="shared", handler="paced",
                                   effects=tmp_path / "runs.txt")
            for _ in range(2400):  # a liveness bound only
                if (await client.tenant("big"))["jobs"]["completed"] + (await client.tenant("small"))["jobs"]["completed"] \
                        == BIG + SMALL:
                    break
                running(workers, tmp_path)
                await asyncio.sleep(0.1)
            started = {job_id: parse_time((await client.info(job_id))["started_at"]) for job_id in big + small}
    finally:
        await stopped(workers, servers)

    order = sorted((at, job_id in small) for job_id, at in started.items() if job_id not in {j["id"] for j in probed})
    places = [n for n, (_, is_small) in enumerate(order) if is_small]
    assert len(places) == SMALL - 3
    assert places[0] < WORKERS * AT_ONCE, "small's first job waited behind big's"
    assert places[-1] < 2 * (SMALL - 3) + WORKERS * AT_ONCE, f"small's last job started {places[-1]}th"


async def test_a_worker_for_one_tenant_runs_its_jobs_alone(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    worker = None
    try:
        async with JobsClient(server.url) as client:
            big, small = await push(client, "big", 5), await push(client, "small", 5)
            worker = start_worker(["--nats"], queue="shared", handler="paced", effects=tmp_path / "runs.txt",
                                  log=tmp_path / "worker.log", nats_url=nats_server.url, extra=("--tenant", "small"))
            for _ in range(1200):  # a liveness bound only
                if (await client.tenant("small"))["jobs"]["completed"] == 5:
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # a worker that would take another tenant's jobs has had its chance
            assert {(await client.info(j))["state"] for j in small} == {"completed"}
            assert {(await client.info(j))["state"] for j in big} == {"available"}
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 30)
        server.stop()
