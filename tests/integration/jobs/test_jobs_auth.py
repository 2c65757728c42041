"""Who may call `seamq jobs serve`: bearer tokens (full and read-only), refused with the OJS error body
(401 unauthenticated, 403 permission_denied); both official SDKs authenticate with their own option;
seamq's CLI and worker send the token from settings; no token appears in any output."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import ojs
import pytest

from helpers.jobs_harness import JobServer
from helpers.sdk_harness import js_sdk, run_node

FULL, OTHER, READ = "full-7f3a9c1e5b2d", "rotated-0c4e8a2f6d1b", "read-9d2b7e4c1a6f"
SECRETS = (FULL, OTHER, READ)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def server(nats_server, tmp_path):
    js_sdk()
    tokens = {"SEAMQ_JOBS__TOKENS": f"{FULL}, {OTHER}", "SEAMQ_JOBS__READ_TOKENS": READ, "SEAMQ_LOG_LEVEL": "debug"}
    server = JobServer(nats_server.url, tmp_path / "server.log", env=tokens).start()
    yield server
    server.stop()


def env_with(**settings: str) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}, **settings}


async def test_no_token_a_wrong_one_and_a_read_token_writing_are_refused(server):
    job = {"type": "auth.check", "args": [], "options": {"queue": "auth"}}
    async with httpx.AsyncClient(base_url=server.url) as http:
        bearer = lambda token: {"Authorization": f"Bearer {token}"}  # noqa: E731
        refused = {
            "no token": await http.post("/ojs/v1/jobs", json=job),
            "wrong token": await http.post("/ojs/v1/jobs", json=job, headers=bearer("guess")),
            "not bearer": await http.post("/ojs/v1/jobs", json=job, headers={"Authorization": f"Basic {FULL}"}),
            "read token, write": await http.post("/ojs/v1/jobs", json=job, headers=bearer(READ)),
            "read token, admin write": await http.post("/ojs/v1/admin/jobs/bulk/cancel", headers=bearer(READ),
                                                      json={"filter": {"queue": "auth"}, "confirm": True}),
            "no token, admin read": await http.get("/ojs/v1/admin/jobs"),
        }
        codes = {name: (r.status_code, r.json()["error"]["code"]) for name, r in refused.items()}
        assert codes == {"no token": (401, "unauthenticated"), "wrong token": (401, "unauthenticated"),
                         "not bearer": (401, "unauthenticated"), "read token, write": (403, "permission_denied"),
                         "read token, admin write": (403, "permission_denied"),
                         "no token, admin read": (401, "unauthenticated")}
        assert refused["no token"].headers["www-authenticate"].startswith("Bearer")
        assert refused["no token"].headers["ojs-version"] == "1.0"  # the OJS headers on a refusal too
        created = await http.post("/ojs/v1/jobs", json=job, headers=bearer(OTHER))  # a rotated-in token
        assert created.status_code == 201
        listed = await http.get("/ojs/v1/admin/jobs", headers=bearer(READ))
        assert [j["id"] for j in listed.json()["items"]] == [created.json()["job"]["id"]]
        assert (await http.get("/ojs/v1/health")).status_code == 200  # probes
        assert (await http.get("/ojs/manifest")).status_code == 200  # discovery
        for answer in refused.values():
            assert not any(secret in answer.text for secret in SECRETS)


async def test_both_sdks_authenticate_with_their_own_option(server):
    client = ojs.Client(server.url, headers={"Authorization": f"Bearer {FULL}"})
    job = await client.enqueue("auth.py", [1], queue="auth-py")
    with pytest.raises(ojs.errors.OJSAPIError) as without:
        await ojs.Client(server.url).enqueue("auth.py", [2], queue="auth-py")
    assert without.value.status_code == 401 and without.value.error.code == "unauthenticated"
    worker = ojs.Worker(server.url, queues=["auth-py"], poll_interval=0.1, headers={"Authorization": f"Bearer {FULL}"})
    ran = []

    @worker.register("auth.py")
    async def handle(ctx):
        ran.append(ctx.job.args)
        return "ok"

    task = asyncio.create_task(worker.start())
    for _ in range(600):
        if (await client.get_job(job.id)).state.value == "completed":
            break
        await asyncio.sleep(0.1)
    await worker.stop()
    await asyncio.wait_for(task, 60)
    assert ran == [[1]] and (await client.get_job(job.id)).state.value == "completed"

    seen = run_node("""
import { OJSClient, OJSWorker } from './dist/esm/index.js';
const url = process.env.OJS_URL, auth = `Bearer ${process.env.OJS_TOKEN}`;
const client = new OJSClient({ url, auth });
const job = await client.enqueue('auth.js', [3], { queue: 'auth-js' });
let refused = null;
try { await new OJSClient({ url }).enqueue('auth.js', [4], { queue: 'auth-js' }); } catch (e) { refused = e.code; }
const worker = new OJSWorker({ url, auth, queues: ['auth-js'], pollInterval: 100, handleSignals: false });
worker.register('auth.js', async (ctx) => ctx.job.args[0] * 2);
await worker.start();
const end = Date.now() + 60000;
while ((await client.getJob(job.id)).state !== 'completed' && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
await worker.stop();
const done = await client.getJob(job.id);
console.log(JSON.stringify({ state: done.state, result: done.result, refused }));
process.exit(0);
""", {"OJS_URL": server.url, "OJS_TOKEN": FULL}, "auth")
    assert seen == {"state": "completed", "result": 6, "refused": "unauthenticated"}


def test_seamq_sends_the_token_from_settings_and_never_shows_one(server, nats_server):
    cli = [sys.executable, "-m", "seamq", "jobs"]
    listed = subprocess.run([*cli, "list", "--url", server.url, "--json"], capture_output=True, text=True, timeout=60,
                            env=env_with(SEAMQ_JOBS__TOKENS=FULL))
    assert listed.returncode == 0, listed.stderr
    refused = subprocess.run([*cli, "list", "--url", server.url], capture_output=True, text=True, timeout=60,
                             env=env_with(SEAMQ_JOBS__TOKENS="not-the-one"))
    assert refused.returncode == 2 and "error[INVALID_CONFIG]" in refused.stderr and "401" in refused.stderr
    read_only = subprocess.run([*cli, "cancel", "--all", "--yes", "--url", server.url, "--queue", "x"],
                               capture_output=True, text=True, timeout=60, env=env_with(SEAMQ_JOBS__READ_TOKENS=READ))
    assert read_only.returncode == 2 and "permission_denied" in read_only.stderr
    helps = [subprocess.run([*cli, command, "--help"], capture_output=True, text=True, timeout=60,
                            env=env_with(SEAMQ_JOBS__TOKENS=FULL, SEAMQ_JOBS__READ_TOKENS=READ))
             for command in ("serve", "worker", "list")]
    outputs = [listed.stdout, listed.stderr, refused.stdout, refused.stderr, read_only.stdout, read_only.stderr,
               *(h.stdout + h.stderr for h in helps), server.log()]
    assert not [secret for secret in SECRETS for text in outputs if secret in text]
    assert "not-the-one" not in refused.stderr


def test_listening_beyond_loopback_needs_a_token_or_no_auth(nats_server):
    done = subprocess.run([sys.executable, "-m", "seamq", "jobs", "serve", "--host", "0.0.0.0", "--port", "9"],
                          capture_output=True, text=True, timeout=60, env=env_with(SEAMQ_NATS__URL=nats_server.url))
    assert done.returncode == 2 and "error[INVALID_CONFIG]" in done.stderr and "SEAMQ_JOBS__TOKENS" in done.stderr
