"""The official Python SDK (openjobspec 0.4.0, unmodified, from ../shared/ojs-sdks) against `seamq jobs serve`:
its own integration tests, then every feature its users reach, client and worker.

Each test waits for what it expects with a deadline (never for a fixed time), on queues of its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import httpx
import ojs
import pytest
from ojs.progress import report_progress

from helpers.jobs_harness import served
from helpers.sdk_harness import SDKS

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with served(tmp_path_factory, "sdk-py") as found:
        yield found


async def until(check, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def state_of(client: ojs.Client, job_id: str) -> str:
    return (await client.get_job(job_id)).state.value


def in_future(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_the_sdks_own_integration_tests_pass(url, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    subprocess.run(["cp", "-r", str(SDKS / "python" / "tests" / "integration"), str(tmp_path / "integration")],
                   check=True)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(tmp_path / "pytest.ini"), str(tmp_path / "integration")], cwd=tmp_path,
                          env={**os.environ, "OJS_INTEGRATION_TESTS": "1", "OJS_SERVER_URL": url},
                          capture_output=True, text=True, timeout=300)
    assert "7 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


async def test_client_enqueue_get_cancel_batch_queues_unique_schedule_expiry(url):
    async with ojs.Client(url) as client:
        job = await client.enqueue("py.echo", ["a", 1], queue="py-client", priority=5, tags=["t"])
        assert (job.state.value, job.args, job.queue) == ("available", ["a", 1], "py-client")
        assert (await client.get_job(job.id)).id == job.id
        assert (await client.cancel_job(job.id)).state == ojs.JobState.CANCELLED

        batch = await client.enqueue_batch([ojs.JobRequest(type="py.echo", args=[i], queue="py-client")
                                            for i in range(3)])
        assert len({j.id for j in batch}) == 3

        names = {q.name for q in await client.list_queues()}
        assert {"default", "py-client"} <= names
        stats = await client.queue_stats("py-client")
        assert (stats.available, stats.status) == (3, "active")
        await client.pause_queue("py-client")
        assert (await client.queue_stats("py-client")).status == "paused"
        await client.resume_queue("py-client")
        assert (await client.queue_stats("py-client")).status == "active"

        unique = ojs.UniquePolicy(keys=["type", "args"], on_conflict="reject")
        await client.enqueue("py.unique", ["u"], queue="py-client", unique=unique)
        with pytest.raises(ojs.errors.OJSAPIError) as refused:
            await client.enqueue("py.unique", ["u"], queue="py-client", unique=unique)
        assert refused.value.status_code == 409

        later = await client.enqueue("py.later", [], queue="py-client", delay_until=in_future(3600))
        assert later.state == ojs.JobState.SCHEDULED
        short = await client.enqueue("py.expiring", [], queue="py-idle", expires_at=in_future(1))
        await until(lambda: _is(client, short.id, "discarded"), what="the expired job discarded")


async def _is(client, job_id, state) -> bool:
    return await state_of(client, job_id) == state


async def run_worker(worker: ojs.Worker):
    task = asyncio.create_task(worker.start())
    await asyncio.sleep(0)
    return task


async def stop_worker(worker: ojs.Worker, task: asyncio.Task) -> None:
    await worker.stop()
    await asyncio.wait_for(task, 60)
    await closed(worker)


async def closed(worker: ojs.Worker) -> None:
    """The SDK's worker leaves its HTTP client open when it stops (ojs.Worker.stop, ../shared/ojs-sdks):
    closed here, so the suite leaves no connection open."""
    await worker._transport.close()


async def test_worker_runs_by_type_with_results_priorities_retries_non_retryable_and_progress(url):
    order, tries = [], {}
    worker = ojs.Worker(url, queues=["py-work"], concurrency=1, poll_interval=0.1, heartbeat_interval=0.5)

    @worker.register("py.add")
    async def add(ctx: ojs.JobContext):
        order.append(ctx.job.args[0])
        await report_progress(ctx._transport, ctx.job_id, 50, message="half")
        return {"sum": sum(ctx.job.args)}

    @worker.register("py.flaky")
    async def flaky(ctx: ojs.JobContext):
        tries[ctx.job_id] = tries.get(ctx.job_id, 0) + 1
        if tries[ctx.job_id] == 1:
            raise RuntimeError("first try fails")
        return "ok"

    @worker.register("py.bad")
    async def bad(ctx: ojs.JobContext):
        tries[ctx.job_id] = tries.get(ctx.job_id, 0) + 1
        raise ValueError("never retried")

    async with ojs.Client(url) as client:
        low = await client.enqueue("py.add", [1, 1], queue="py-work", priority=1)
        high = await client.enqueue("py.add", [2, 2], queue="py-work", priority=9)
        retry = ojs.RetryPolicy(max_attempts=3, initial_interval="PT0.2S", jitter=False,
                                non_retryable_errors=["ValueError"])
        flaky_job = await client.enqueue("py.flaky", [], queue="py-work", retry=retry)
        bad_job = await client.enqueue("py.bad", [], queue="py-work", retry=retry)
        task = await run_worker(worker)
        try:
            for job in (low, high, flaky_job):
                await until(lambda j=job: _is(client, j.id, "completed"), what=f"{job.type} completed")
            await until(lambda: _is(client, bad_job.id, "discarded"), what="the ValueError job discarded")
        finally:
            await stop_worker(worker, task)
        assert order == [2, 1]  # the higher priority first
        done = await client.get_job(high.id)
        assert done.result == {"sum": 4}
        progress = httpx.get(f"{url}/ojs/v1/jobs/{high.id}/progress").json()
        assert (progress["percentage"], progress["message"]) == (50, "half")
        assert tries[flaky_job.id] == 2 and tries[bad_job.id] == 1
        failed = httpx.get(f"{url}/ojs/v1/jobs/{bad_job.id}").json()["job"]
        assert failed["error"]["type"] == "ValueError"


async def test_a_long_job_with_a_short_visibility_timeout_runs_once(url):
    runs: list[str] = []

    def make(name: str) -> ojs.Worker:
        worker = ojs.Worker(url, queues=["py-long"], poll_interval=0.1, heartbeat_interval=0.5,
                            visibility_timeout_ms=4000)

        @worker.register("py.long")
        async def long(ctx: ojs.JobContext):
            runs.append(name)
            await asyncio.sleep(12)  # three visibility timeouts
            return name

        return worker

    first, second = make("first"), make("second")
    async with ojs.Client(url) as client:
        job = await client.enqueue("py.long", [], queue="py-long")
        tasks = [await run_worker(first)]
        await until(lambda: _is(client, job.id, "active"), what="the job claimed")
        tasks.append(await run_worker(second))
        try:
            await until(lambda: _is(client, job.id, "completed"), timeout=120, what="the long job completed")
        finally:
            await stop_worker(first, tasks[0])
            await stop_worker(second, tasks[1])
        assert runs == ["first"]
        assert (await client.get_job(job.id)).attempt == 1


async def test_cancelling_a_running_job_stops_it(url):
    """The SDK's worker knows no per-job stop: the server answers its heartbeat with `terminate` when
    every job it runs was cancelled; it stops, cancelling the job after its 25 s grace."""
    seen: list[str] = []
    worker = ojs.Worker(url, queues=["py-cancel"], poll_interval=0.1, heartbeat_interval=0.5)

    @worker.register("py.forever")
    async def forever(ctx: ojs.JobContext):
        seen.append("started")
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async with ojs.Client(url) as client:
        job = await client.enqueue("py.forever", [], queue="py-cancel")
        task = await run_worker(worker)
        await until(lambda: _is(client, job.id, "active"), what="the job running")
        await client.cancel_job(job.id)
        await asyncio.wait_for(task, 120)  # the worker stopped on its own
        await closed(worker)
        assert seen == ["started", "cancelled"]
        assert await state_of(client, job.id) == "cancelled"


async def test_workflows_chain_group_batch_and_cancel(url):
    worker = ojs.Worker(url, queues=["py-flow"], poll_interval=0.1, heartbeat_interval=0.5)

    @worker.register("py.step")
    async def step(ctx: ojs.JobContext):
        return ctx.job.args[0]

    async with ojs.Client(url) as client:
        q = ojs.JobRequest
        chain = await client.workflow(ojs.chain("c", [q(type="py.step", args=[i], queue="py-flow") for i in range(3)]))
        group = await client.workflow(ojs.group("g", [q(type="py.step", args=[i], queue="py-flow") for i in range(3)]))
        batch = await client.workflow(ojs.batch("b", [q(type="py.step", args=[1], queue="py-flow")],
                                                on_complete=q(type="py.step", args=["done"], queue="py-flow")))
        assert [s.id for s in chain.steps] == ["step-0", "step-1", "step-2"]
        task = await run_worker(worker)
        try:
            for wf in (chain, group, batch):
                async def completed(wf=wf):
                    return (await client.get_workflow(wf.id)).state == "completed"
                await until(completed, what=f"workflow {wf.name} completed")
        finally:
            await stop_worker(worker, task)
        shown = await client.get_workflow(batch.id)
        assert {s.id: s.state for s in shown.steps} == {"step-0": "completed", "on_complete": "completed"}
        idle = await client.workflow(ojs.chain("idle", [q(type="py.step", args=[1], queue="py-nobody")] * 2))
        await client.cancel_workflow(idle.id)
        assert (await client.get_workflow(idle.id)).state == "cancelled"


async def test_cron_schemas_and_dead_letters(url):
    async with ojs.Client(url) as client:
        await client.register_cron_job("py-nightly", "0 3 * * *", "py.report", ["x"], queue="py-cron")
        listed = await client.list_cron_jobs()
        assert [(c["name"], c["cron"], c["type"]) for c in listed["cron_jobs"]] == [
            ("py-nightly", "0 3 * * *", "py.report")]
        await client.unregister_cron_job("py-nightly")
        assert (await client.list_cron_jobs())["cron_jobs"] == []

        uri = "urn:example:py.mail:1"
        await client.register_schema(uri, "py.mail", "1.0.0", {"type": "array", "items": [{"type": "string"}]})
        assert [s["uri"] for s in (await client.list_schemas())["schemas"]] == [uri]
        assert (await client.get_schema(uri))["schema"]["version"] == "1.0.0"
        await client.enqueue("py.mail", ["to@example.com"], schema=uri)
        with pytest.raises(ojs.errors.OJSAPIError) as wrong:
            await client.enqueue("py.mail", [42], schema=uri)
        assert wrong.value.status_code == 400
        await client.delete_schema(uri)
        assert (await client.list_schemas())["schemas"] == []

        # The Python SDK cannot ask for dead-lettering (its RetryPolicy has no on_exhaustion): the job
        # is pushed as the JS SDK would, then handled as a dead letter through this SDK.
        pushed = httpx.post(f"{url}/ojs/v1/jobs", json={"type": "py.dead", "args": [], "options": {
            "queue": "py-dlq", "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}).json()["job"]
        fetched = httpx.post(f"{url}/ojs/v1/workers/fetch", json={"queues": ["py-dlq"]}).json()["jobs"]
        assert [j["id"] for j in fetched] == [pushed["id"]]
        httpx.post(f"{url}/ojs/v1/workers/nack", json={"job_id": pushed["id"], "error": {"message": "boom"}})
        dead = await client.list_dead_letter_jobs(queue="py-dlq")
        assert [j["id"] for j in dead["jobs"]] == [pushed["id"]]
        assert (await client.retry_dead_letter_job(pushed["id"])).state == ojs.JobState.AVAILABLE
        fetched = httpx.post(f"{url}/ojs/v1/workers/fetch", json={"queues": ["py-dlq"]}).json()["jobs"]
        httpx.post(f"{url}/ojs/v1/workers/nack", json={"job_id": pushed["id"], "error": {"message": "boom"}})
        await client.delete_dead_letter_job(pushed["id"])
        assert (await client.list_dead_letter_jobs(queue="py-dlq"))["jobs"] == []
