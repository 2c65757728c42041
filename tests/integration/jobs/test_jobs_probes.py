"""What operators' tools ask of a job server beyond the OJS core (issue 49): Prometheus' `/metrics`
with every queue's exact counts; a stopping `seamq jobs worker` says it drains and then that it ended,
and the server hands a draining worker nothing new."""

from __future__ import annotations

import asyncio
import re
import signal

import aiohttp

from seamq.jobs.client import JobsClient

from helpers.jobs_harness import JobServer, start_worker


async def test_metrics_show_each_queues_jobs_by_state_as_prometheus_reads_them(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    try:
        async with JobsClient(server.url) as client:
            await client.push_batch([{"type": "m.one", "args": [n], "options": {"queue": "metered"}} for n in range(3)])
            [taken] = await client.fetch(["metered"])
            await client.ack(taken["id"], None)
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as answer:
            assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
            text = await answer.text()
        counts = {m[0]: float(m[1]) for m in re.findall(r'^seamq_jobs\{queue="metered",state="(\w+)"\} (\S+)$', text, re.M)}
        assert counts["available"] == 2 and counts["completed"] == 1 and counts["active"] == 0, counts
        assert re.search(r'^seamq_jobs_processed_total\{queue="metered"\} 1\.0$', text, re.M), text[:2000]
        assert "process_cpu_seconds_total" in text
    finally:
        server.stop()


async def test_a_stopping_worker_says_so_and_a_draining_one_is_handed_nothing(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    worker = None
    try:
        async with JobsClient(server.url) as client:
            worker = start_worker(["--url", server.url], queue="drained", handler="span", effects=tmp_path / "runs.txt",
                                  log=tmp_path / "worker.log", extra=("--worker-id", "w-drain"))
            async with aiohttp.ClientSession() as http:
                for _ in range(600):  # until the server has heard from it (a liveness bound only)
                    async with http.get(f"{server.url}/ojs/v1/workers/w-drain/health") as answer:
                        if answer.status == 200:
                            break
                    await asyncio.sleep(0.05)
                worker.send_signal(signal.SIGTERM)
                assert worker.wait(60) == 0, (tmp_path / "worker.log").read_text()
                async with http.get(f"{server.url}/ojs/v1/workers/w-drain/health") as answer:
                    assert answer.status == 503 and (await answer.json())["state"] == "terminate"
            await client.push_batch([{"type": "test.span", "args": [n], "options": {"queue": "drained"}} for n in (1, 2)])
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{server.url}/ojs/v1/workers/beat", json={
                        "worker_id": "w-other", "state": "drain", "active_jobs": 0}) as answer:
                    assert answer.status == 200 and (await answer.json())["acknowledged"] is True
            assert await client.fetch(["drained"], worker_id="w-other") == []  # draining: nothing new
            # One that said it ended and fetches again is a new life under the same id (restarted).
            assert len(await client.fetch(["drained"], worker_id="w-drain")) == 1
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        server.stop()
