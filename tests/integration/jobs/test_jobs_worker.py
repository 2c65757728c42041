"""`seamq jobs worker` end to end: 500 jobs, 10% failing once, a SIGTERM mid-run, then a second worker.

Counted afterwards: every job completed, each job's side effect exactly once, each failed job
retried once and no sooner than its backoff said.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from seamq.jobs.client import JobsClient, JobsError
from seamq.jobs.model import parse_time

from helpers.jobs_harness import JobServer, push_numbered, start_worker

JOBS = 500
RETRY = {"max_attempts": 3, "initial_interval": "PT0.3S", "backoff_coefficient": 2.0, "jitter": False}


def start(url: str, effects: Path, log: Path, name: str) -> subprocess.Popen:
    return start_worker(["--url", url], queue="work", handler="record", effects=effects, log=log,
                        extra=("--worker-id", name))


def effects_of(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def test_worker_runs_every_job_once_with_retries_and_survives_sigterm(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    effects = tmp_path / "effects.txt"
    try:
        async with JobsClient(server.url) as client:
            ids = await push_numbered(client, JOBS, "test.record", {"queue": "work", "retry": RETRY})
            first = start(server.url, effects, tmp_path / "worker-1.log", "first")
            while len(effects_of(effects)) < 150:
                await asyncio.sleep(0.02)
                assert first.poll() is None, (tmp_path / "worker-1.log").read_text()
            first.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(first.wait, 30) == 0, (tmp_path / "worker-1.log").read_text()
            stopped_at = len(effects_of(effects))
            assert stopped_at < JOBS  # the stop came mid-run
            second = start(server.url, effects, tmp_path / "worker-2.log", "second")
            try:
                for _ in range(1200):
                    if len(effects_of(effects)) >= JOBS:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # the last acks, and any side effect that would come twice
                jobs = {job_id: await client.info(job_id) for job_id in ids}
            finally:
                second.send_signal(signal.SIGTERM)
                await asyncio.to_thread(second.wait, 30)
    finally:
        server.stop()

    done = effects_of(effects)
    assert sorted(job_id for job_id, *_ in done) == sorted(ids), "each job's side effect exactly once"
    assert {job["state"] for job in jobs.values()} == {"completed"}
    for job_id, n, attempt in done:
        job = jobs[job_id]
        if int(n) % 10:
            assert int(attempt) == 1 and not job.get("errors")
            continue
        assert int(attempt) == 2 and len(job["errors"]) == 1 and job["errors"][0]["type"] == "helpers.jobs_handlers.Flaky"
        failed_at = parse_time(job["errors"][0]["occurred_at"])
        assert job["retry_delay_ms"] == 300
        assert (parse_time(job["started_at"]) - failed_at).total_seconds() >= 0.29, "retried before its backoff"
    # The second worker took what the first had not begun: the stop lost nothing.
    assert any(job.get("worker_id") == "second" for job in jobs.values()) or stopped_at == JOBS


def test_a_url_that_is_no_ojs_server_is_said_at_start(tmp_path):
    """Something answers, but 404 to the health check: a wrong URL, said at once (not retried forever)."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
        result = subprocess.run([sys.executable, "-m", "seamq", "jobs", "worker", "--url",
                                 f"http://127.0.0.1:{server.server_port}/ojs/v1", "--queue", "q",
                                 "--handler", "json:dumps"], env=env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 2 and "error[INVALID_CONFIG]" in result.stderr
    assert "is not an OJS server" in " ".join(result.stderr.split()) and "Traceback" not in result.stderr


async def test_an_answer_that_is_no_ojs_answer_is_a_coded_error_not_a_crash():
    """A proxy's HTML page, JSON that is not an object, an `error` that is a string: each a JobsError
    with a code and a message a person can read, never a TypeError from deep in the client."""
    from aiohttp import web

    async def proxy_page(_):
        return web.Response(status=502, text="<html>bad</html>", content_type="text/html")

    async def a_list(_):
        return web.json_response([1, 2])

    async def string_error(_):
        return web.json_response({"error": "nope"}, status=404)

    app = web.Application()
    app.router.add_post("/ojs/v1/jobs", proxy_page)
    app.router.add_get("/ojs/v1/health", a_list)
    app.router.add_get("/ojs/v1/jobs/{id}", string_error)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with JobsClient(f"http://127.0.0.1:{port}", retries=1) as jobs:
            seen = []
            for call in (jobs.push("t", []), jobs.health(), jobs.info("x")):
                try:
                    await call
                except JobsError as exc:
                    seen.append((exc.status, exc.code, exc.message))
    finally:
        await runner.cleanup()
    assert seen == [(502, "invalid_response", "the answer is not a JSON object (Bad Gateway)"),
                    (200, "invalid_response", "the answer is not a JSON object (OK)"),
                    (404, "error", "Not Found")]


async def test_a_sync_job_still_running_after_grace_keeps_its_lease_and_is_never_run_twice(nats_server, tmp_path):
    """A sync function's thread cannot be stopped: releasing its job when grace ended let another
    worker run it while the thread went on."""
    import threading

    from seamq.jobs.worker import Worker, WorkerConfig

    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    started, finish, runs = threading.Event(), threading.Event(), []

    def slow(n):
        runs.append(n)
        started.set()
        finish.wait(30)
        return n

    try:
        async with JobsClient(server.url) as client:
            job = await client.push("slow", [1], queue="slow")
            worker = Worker(client, slow, WorkerConfig(queues=("slow",), grace=0.3, visibility_timeout=3.0))
            running = asyncio.create_task(worker.run())
            await asyncio.to_thread(started.wait, 10)
            worker.stop()
            stolen = []
            for _ in range(20):  # past grace and twice the visibility timeout: heartbeats keep the lease
                stolen += await client.fetch(["slow"], count=1, worker_id="thief", visibility_timeout_ms=3000)
                await asyncio.sleep(0.3)
            assert stolen == [], f"another worker got the job while its function ran: {stolen}"
            assert not running.done()
            finish.set()
            await asyncio.wait_for(running, 10)
            assert (await client.info(job["id"]))["state"] == "completed" and runs == [1]
    finally:
        finish.set()
        server.kill()


async def test_a_slot_frees_when_its_function_returns_and_a_stop_waits_for_every_ack(monkeypatch):
    """The next fetch does not wait for the last round's acks, at most SETTLES_AHEAD slots' worth of
    acks are on their way (1 here), each saying it may wait, and a stopping worker returns only once
    each is answered. The job server here is an in-memory stand-in: what is tested is the worker's
    own bookkeeping."""
    from seamq.jobs import worker as module
    from seamq.jobs.worker import Worker, WorkerConfig

    monkeypatch.setattr(module, "SETTLES_AHEAD", 1)
    monkeypatch.setattr(module, "AHEAD", 0.0)  # no job fetched ahead: the bound on acks alone
    waits = []

    release, ran, acked, fetched = asyncio.Event(), [], [], []

    class Server:
        jobs = [{"id": f"j{n}", "type": "t", "args": [n]} for n in (1, 2, 3)]

        async def fetch(self, queues, *, count, worker_id, visibility_timeout_ms, tenant=None):
            fetched.append(count)
            return [self.jobs.pop(0)] if self.jobs else []

        async def ack(self, job_id, result=None, *, may_wait=0.0):
            waits.append(may_wait)
            await release.wait()
            acked.append(job_id)
            return {"acknowledged": True}

        async def heartbeat(self, worker_id, active_jobs, *, visibility_timeout_ms):
            return {"state": "running", "jobs_cancelled": []}

    async def function(n):
        ran.append(n)

    worker = Worker(Server(), function, WorkerConfig(queues=("q",), concurrency=1, idle_wait=0.01))
    running = asyncio.create_task(worker.run())
    deadline = asyncio.get_running_loop().time() + 60  # a busy machine may take long; a quick one leaves at once
    while len(ran) < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert ran == [1, 2] and acked == [] and len(fetched) == 2  # the second ran while the first ack waited;
    worker.stop()  # then two acks on their way (one slot's worth more) held the third back
    await asyncio.sleep(0.1)
    assert not running.done()
    release.set()
    await asyncio.wait_for(running, 10)
    assert acked == ["j1", "j2"] and ran == [1, 2] and waits == [module.ACK_WAIT] * 2
