"""For users of seamq's own worker and CLI: one worker process runs several job types, routed by type;
`seamq jobs list/show/retry/cancel` (and --json) through the server's admin API, with coded errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from seamq.embedded import free_port
from seamq.jobs.client import JobsClient

from helpers.jobs_harness import JobServer
from helpers import TESTS

FAST = {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False, "on_exhaustion": "dead_letter"}


def seamq(*args: str, check: int | None = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    done = subprocess.run([sys.executable, "-m", "seamq", "jobs", *args], env=env, capture_output=True, text=True,
                          timeout=60)
    if check is not None:
        assert done.returncode == check, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture
def server(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    yield server.url
    server.stop()


async def wait_for(check, seconds: float = 60):
    for _ in range(int(seconds / 0.05)):
        if found := await check():
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("not within the time")


async def test_one_worker_runs_several_job_types_and_retries_a_type_it_does_not_know(server, tmp_path):
    effects = tmp_path / "effects.txt"
    async with JobsClient(server) as client:
        mail = await client.push("mail.send", ["ada@example.com"], queue="mixed")
        report = await client.push("report.build", [21], queue="mixed")
        unknown = await client.push("video.encode", [1], queue="mixed", options={"retry": FAST})
        env = {**os.environ, "JOBS_TEST_EFFECTS": str(effects), "PYTHONPATH": str(TESTS)}
        with open(tmp_path / "worker.log", "ab") as log:
            worker = subprocess.Popen([sys.executable, "-m", "seamq", "jobs", "worker", "--url", server,
                                       "--queue", "mixed", "--handler", "helpers.jobs_handlers:routed"], env=env,
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            async def discarded():
                return (await client.info(unknown["id"]))["state"] == "discarded"
            await wait_for(discarded)
            done = {j: await client.info(j) for j in (mail["id"], report["id"])}
        finally:
            worker.terminate()
            worker.wait(30)
        lost = await client.job(unknown["id"])
    assert done[mail["id"]]["result"] == "sent to ada@example.com" and done[report["id"]]["result"] == 42
    assert sorted(effects.read_text().split("\n")[:-1]) == [f"mail ada@example.com {mail['id']}", "report 21"]
    assert [(e["type"], e["attempt"]) for e in lost["errors"]] == [("UnknownJobType", 1), ("UnknownJobType", 2)]
    assert "no function for job type 'video.encode'" in lost["errors"][0]["message"]
    assert "mail.send, report.build" in lost["errors"][0]["message"]
    assert "job_type_unknown" in (tmp_path / "worker.log").read_text()  # every failed attempt logged


async def test_the_cli_lists_shows_retries_and_cancels_jobs(server):
    async with JobsClient(server) as client:
        dead = await client.push("bill.charge", [1], queue="bills", options={"retry": {"max_attempts": 1,
                                                                                       "on_exhaustion": "dead_letter"}})
        [fetched] = await client.fetch(["bills"], worker_id="cli-test")
        await client.nack(fetched["id"], ValueError("card declined"))
        waiting = [await client.push("bill.remind", [n], queue="reminders") for n in range(3)]

    listed = json.loads(seamq("list", "--url", server, "--json").stdout)
    assert {j["id"] for j in listed} == {dead["id"], *(j["id"] for j in waiting)}
    only_dead = json.loads(seamq("list", "--url", server, "--dead-letters", "--json").stdout)
    assert [(j["id"], j["error"]["type"]) for j in only_dead] == [(dead["id"], "ValueError")]
    table = seamq("list", "--url", server, "--queue", "bills").stdout
    assert "card declined" in table and "1 jobs" in table
    shown = seamq("show", dead["id"], "--url", server).stdout
    assert "ValueError: card declined" in shown and "discarded" in shown
    assert "dead letter" in shown and f"seamq jobs retry {dead['id']} --dead-letters" in " ".join(shown.split())

    assert json.loads(seamq("retry", dead["id"], "--url", server, "--json").stdout)["state"] == "available"
    again = seamq("retry", dead["id"], "--url", server, check=1)
    assert "error[JOB_REFUSED]" in again.stderr and "only discarded or cancelled" in " ".join(again.stderr.split())

    # What --all would cancel is counted as the cancel counts it: unfinished jobs, not finished ones.
    async with JobsClient(server) as client:
        [early] = await client.fetch(["reminders"], worker_id="cli-test")
        await client.ack(early["id"], None)
        waiting.append(await client.push("bill.remind", [3], queue="reminders"))
    refused = seamq("cancel", "--all", "--url", server, "--queue", "reminders", check=2)
    assert refused.stderr.startswith("error[CONFIRMATION_NEEDED]: --all selects 3 unfinished jobs"), refused.stderr
    assert "cancelled 3 of 3" in seamq("cancel", "--all", "--yes", "--url", server, "--queue", "reminders").stdout
    retried = json.loads(seamq("retry", "--all", "--url", server, "--queue", "reminders", "--json").stdout)
    assert retried["succeeded"] == 3

    # An id as tables show it, cut: the start of one, as `seamq dlq show` takes message ids.
    cancelled = next(j["id"] for j in waiting if j["id"] != early["id"])
    prefix = cancelled[:8] if all(not j["id"].startswith(cancelled[:8]) for j in waiting if j["id"] != cancelled) \
        else cancelled[:30]
    assert f"job {cancelled} is cancelled" in seamq("cancel", prefix, "--url", server).stdout
    assert "error[NOT_FOUND]: no job with id ffff" in seamq("show", "ffff", "--url", server, check=2).stderr
    assert "error[INVALID_CONFIG]" in seamq("show", "xy!", "--url", server, check=2).stderr
    schemeless = seamq("list", "--url", server.removeprefix("http://"), check=2)
    assert schemeless.stderr.startswith("error[INVALID_CONFIG]: --url") and "http://" in schemeless.stderr

    assert seamq("retry", "--url", server, check=2).stderr.startswith("error[INVALID_CONFIG]")
    missing = seamq("show", "01961111-aaaa-7bbb-8ccc-dddddddddddd", "--url", server, check=2)
    assert "error[NOT_FOUND]" in missing.stderr
    away = seamq("list", "--url", f"http://127.0.0.1:{free_port()}", check=1)
    assert "error[BROKER_UNAVAILABLE]" in away.stderr and "cannot reach the job server" in away.stderr
