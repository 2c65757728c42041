"""Job functions for `seamq jobs worker` in the tests (imported by the worker subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import time

from seamq.jobs.handlers import JobHandlers


class Flaky(Exception):
    """The first attempt of every tenth job fails with this."""


async def record(n: int, *, job: dict) -> dict:
    """Fail every tenth job's first attempt; on success, write the side effect last (no await after it,
    so a stop cannot cancel the job between the side effect and the return)."""
    await asyncio.sleep(0.01)
    if n % 10 == 0 and job["attempt"] == 1:
        raise Flaky(f"job {n} fails its first attempt")
    with open(os.environ["JOBS_TEST_EFFECTS"], "a") as effects:
        effects.write(f"{job['id']} {n} {job['attempt']}\n")
    return {"n": n}


# One worker, several job types (seamq.jobs.handlers): `--handler helpers.jobs_handlers:routed`.
routed = JobHandlers()


@routed.handler("mail.send")
async def send_mail(to: str, *, job: dict) -> str:
    with open(os.environ["JOBS_TEST_EFFECTS"], "a") as effects:
        effects.write(f"mail {to} {job['id']}\n")
    return f"sent to {to}"


@routed.handler("report.build")
def build_report(n: int) -> int:  # sync: runs in a thread
    with open(os.environ["JOBS_TEST_EFFECTS"], "a") as effects:
        effects.write(f"report {n}\n")
    return n * 2


def _note(line: str) -> None:
    with open(os.environ["JOBS_TEST_EFFECTS"], "a") as effects:
        effects.write(line + "\n")


async def span(n: int, *, job: dict) -> dict:
    """Each run written as it starts and as it ends (`end`, or `fail` for every tenth job's first
    attempt), with the process and the time: two runs of one job must never overlap."""
    _note(f"start {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
    await asyncio.sleep(0.02)
    if n % 10 == 0 and job["attempt"] == 1:
        _note(f"fail {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
        raise Flaky(f"job {n} fails its first attempt")
    _note(f"end {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
    return {"n": n}


def first_failure(folder: str, job_id: str) -> bool:
    """Whether this run is the first of its job to fail, among every process that shares `folder`: a
    file made once per job, atomically (its time is the failure's)."""
    try:
        os.close(os.open(os.path.join(folder, job_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


async def flaky_once(n: int, flaky: bool, *, job: dict) -> dict:
    """`span`'s lines, for tests/cluster/jobs/test_jobs_cluster.py: a flaky job fails the first run that any worker
    gives it (whatever its attempt: one may have been claimed by a server killed before it answered)."""
    _note(f"start {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
    await asyncio.sleep(0.01)
    if flaky and first_failure(os.environ["JOBS_TEST_FAILS"], job["id"]):
        _note(f"fail {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
        raise Flaky(f"job {n} fails its first run")
    _note(f"end {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
    return {"n": n}


async def count_to(n: int, *, job: dict, checkpoint) -> dict:
    """Counts to n, saving each step as its checkpoint; the first run stops after step 3 and waits
    (for a kill -9) once it has noted that step 3 is stored. A later run starts where it was left."""
    start = checkpoint.state or 0
    _note(f"start {job['id']} {job['attempt']} {os.getpid()} from {start}")
    for step in range(start + 1, n + 1):
        await checkpoint.save(step)
        if step == 3 and not checkpoint.resumed:
            _note(f"saved {job['id']} 3")
            await asyncio.sleep(3600)
    return {"from": start, "to": n, "attempt": job["attempt"]}


async def paced(n: int, seconds: float, *, job: dict) -> dict:
    """`span`'s lines for a run of `seconds`, for tests/integration/jobs/test_jobs_rate_limits.py."""
    _note(f"start {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
    await asyncio.sleep(seconds)
    _note(f"end {job['id']} {job['attempt']} {os.getpid()} {time.time()}")
    return {"n": n}


async def noted(*args, job: dict) -> int:
    """The args as the function got them, one line per run (tests/integration/jobs/test_jobs_sealing.py)."""
    _note(f"args {job['id']} {json.dumps(args)}")
    return len(args)
