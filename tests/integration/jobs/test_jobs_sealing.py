"""Sealed args end to end: jobs pushed by `JobsClient(keys=...)` are stored as ciphertext, opened by
`seamq jobs worker --nats` given the keys (SEAMQ_JOBS__ENCRYPTION_KEYS), and a job sealed with a key
the worker does not have fails its attempt saying so, the key never in any output."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import urllib.request

from seamq.jobs.client import JobsClient
from seamq.jobs.sealing import Keys

from helpers.jobs_harness import JobServer, start_worker

KEY, OTHER = base64.b64encode(bytes(range(32))).decode(), base64.b64encode(bytes(range(5, 37))).decode()


async def test_sealed_args_are_opened_by_the_worker_alone(nats_server, tmp_path):
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    effects, worker = tmp_path / "runs.txt", None
    try:
        async with JobsClient(server.url, keys=Keys.parse(f"k1:{KEY}")) as sealer, \
                JobsClient(server.url, keys=Keys.parse(f"k9:{OTHER}")) as stranger:
            ids = [(await sealer.push("pii.mail", ["ada@example.com", {"card": "4111-1111"}], queue="pii"))["id"]
                   for _ in range(3)]
            lost = (await stranger.push("pii.mail", ["grace@example.com"], queue="pii",
                                        retry={"max_attempts": 1}))["id"]
            for job_id in [*ids, lost]:
                with urllib.request.urlopen(f"{server.url}/ojs/v1/jobs/{job_id}") as answer:
                    stored = answer.read().decode()
                assert "example.com" not in stored and "4111" not in stored
                assert '"ojs.codec.key_id":"k1"' in stored or '"ojs.codec.key_id":"k9"' in stored
            worker = start_worker(["--nats"], queue="pii", handler="noted", effects=effects, log=tmp_path / "worker.log",
                                  nats_url=nats_server.url, env={"SEAMQ_JOBS__ENCRYPTION_KEYS": f"k1:{KEY}"})
            for _ in range(1200):  # a liveness bound only
                states = [(await sealer.info(j))["state"] for j in [*ids, lost]]
                if states == ["completed"] * 3 + ["discarded"]:
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                await asyncio.sleep(0.05)
            failed = await sealer.info(lost)
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 30)
        server.stop()
    seen = [json.loads(line.split(" ", 2)[2]) for line in effects.read_text().splitlines()]
    assert seen == [["ada@example.com", {"card": "4111-1111"}]] * 3
    assert failed["error"]["code"] == "args_unopenable" and "'k9'" in failed["error"]["message"]
    logs = (tmp_path / "worker.log").read_text() + (tmp_path / "server.log").read_text()
    assert KEY not in logs and OTHER not in logs and "job_args_unopenable" in logs
