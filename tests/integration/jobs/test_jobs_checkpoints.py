"""Durable execution: a job whose worker is killed -9 after it saved a checkpoint resumes from that
checkpoint on its next attempt, with `seamq jobs worker` over HTTP and native, and with the official
Python and JS SDKs' durable contexts (issue 49).

The job counts to 6, saving each step; its first run is killed once step 3 is stored. Counted after:
the second attempt started from 3, not 0, and finished; the lost attempt is in the job's errors.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from seamq.jobs.client import JobsClient

from helpers.jobs_harness import JobServer, start_worker
from helpers.sdk_harness import js_sdk

LEASE = 2  # seconds: the killed worker's job comes back this long after it dies


def noted(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def killed_and_resumed(client: JobsClient, job_id: str, start, saved: str, effects: Path, tmp_path: Path,
                             spawned: list[subprocess.Popen]) -> tuple[dict, dict]:
    """A first worker killed -9 once it noted `saved`, then a second: the job between them, and as it ended."""
    spawned.append(start("first"))
    for _ in range(1200):  # a liveness bound only
        if saved in noted(effects):
            break
        assert spawned[0].poll() is None, (tmp_path / "first.log").read_text()
        await asyncio.sleep(0.05)
    spawned[0].send_signal(signal.SIGKILL)
    spawned[0].wait()
    between = await client.job(job_id)
    spawned.append(start("second"))
    for _ in range(1200):
        shown = await client.job(job_id)
        if shown["state"] == "completed":
            break
        await asyncio.sleep(0.05)
    assert shown["state"] == "completed", (shown, (tmp_path / "second.log").read_text())
    return between, shown


def stopped(spawned: list[subprocess.Popen]) -> None:
    for process in spawned:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("how", ["http", "native"])
async def test_a_job_killed_after_a_checkpoint_resumes_from_it(nats_server, tmp_path, how):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    effects = tmp_path / "runs.txt"
    via = ["--url", server.url] if how == "http" else ["--nats"]

    def worker(name: str):
        return start_worker(via, queue="durable", handler="count_to", effects=effects, log=tmp_path / f"{name}.log",
                            nats_url=nats_server.url, extra=("--visibility-timeout", str(LEASE)))
    spawned: list[subprocess.Popen] = []
    try:
        async with JobsClient(server.url) as client:
            [job] = await client.push_batch([{"type": "test.count", "args": [6], "options": {
                "queue": "durable", "retry": {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False}}}])
            between, shown = await killed_and_resumed(client, job["id"], worker, f"saved {job['id']} 3", effects,
                                                      tmp_path, spawned)
            assert between["checkpoint"] == {"state": 3, "sequence": 3}
            assert shown["result"] == {"from": 3, "to": 6, "attempt": 2}
            assert [line.split()[-1] for line in noted(effects) if line.startswith("start")] == ["0", "3"]
            assert len(shown["errors"]) == 1, shown  # the killed attempt: its lease ran out, kept in history
            assert shown["checkpoint"] == {"state": 6, "sequence": 6}  # kept, read-only, once the job ended
    finally:
        stopped(spawned)
        server.stop()

JS_DURABLE_WORKER = """
import { OJSWorker } from './dist/esm/index.js';
import { appendFileSync } from 'node:fs';
const [url, effects] = process.argv.slice(2);
const note = (line) => appendFileSync(effects, line + '\\n');
const worker = new OJSWorker({ url, queues: ['sdk-durable'], pollInterval: 100, heartbeatInterval: 500,
                               visibilityTimeout: 2000, handleSignals: false });
worker.registerDurable('test.durable-steps', async (ctx, dc) => {
  for (let step = 1; step <= 6; step++) {
    await dc.sideEffect(`step-${step}`, async () => { note(`effect ${step} ${process.pid}`); return step; });
    await dc.checkpoint(step, { step });
    if (step === 3 && ctx.attempt === 1) { note('saved 3'); await new Promise(() => {}); }
  }
  await dc.complete();
  return { steps: 6, attempt: ctx.attempt };
});
await worker.start();
"""


def sdk_worker(sdk: str) -> list[str]:
    """The command of an official SDK's worker running the durable job of tests/helpers/sdk_durable_worker.py."""
    if sdk == "python":
        return [sys.executable, str(Path(__file__).resolve().parents[2] / "helpers" / "sdk_durable_worker.py")]
    script = js_sdk() / "durable-worker.mjs"
    script.write_text(JS_DURABLE_WORKER)
    return ["node", str(script)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sdk", ["python", "js"])
async def test_an_sdks_durable_job_replays_its_checkpoint_after_a_kill(nats_server, tmp_path, sdk):
    """The SDKs keep their side effects' replay log in the checkpoint's metadata (POST /checkpoints/{id},
    GET /checkpoints/{id}/resume): after the kill, steps 1-3 are replayed, not run again."""
    command = sdk_worker(sdk)  # the JS SDK built first: npm's time is not the server's
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    effects = tmp_path / "effects.txt"

    def worker(name: str) -> subprocess.Popen:
        with open(tmp_path / f"{name}.log", "ab") as out:
            return subprocess.Popen([*command, server.url, str(effects)], stdout=out, stderr=subprocess.STDOUT)
    spawned: list[subprocess.Popen] = []
    try:
        async with JobsClient(server.url) as client:
            [job] = await client.push_batch([{"type": "test.durable-steps", "args": [], "options": {
                "queue": "sdk-durable", "retry": {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False}}}])
            _, shown = await killed_and_resumed(client, job["id"], worker, "saved 3", effects, tmp_path, spawned)
            assert shown["result"] == {"steps": 6, "attempt": 2}
            first, second = (str(p.pid) for p in spawned)
            ran = [line.split()[1:] for line in noted(effects) if line.startswith("effect")]
            assert ran == [["1", first], ["2", first], ["3", first], ["4", second], ["5", second], ["6", second]]
            assert "checkpoint" not in shown  # the SDK deletes its checkpoint once the job is done
    finally:
        stopped(spawned)
        server.stop()
