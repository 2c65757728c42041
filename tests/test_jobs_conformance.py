"""The OJS conformance suite (v0.4.0) against `seamq jobs serve`, one pytest case per JSON file.

The suite is read where CI has it, beside the clone (`../shared/ojs-conformance`), or from
$OJS_CONFORMANCE_DIR; it is never copied into the project. Cases run in the runner's order
(test id, then path) with a reset before each, in --strict mode (raw_body sent, ASSERT steps
evaluated), against an embedded nats-server and the server on free ports.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from seamq.dev.embedded import NatsServer, free_port

from ojs_runner import Runner, load_cases

ROOT = Path(__file__).resolve().parent.parent
# Built so far (issue 12 lands in steps): levels 0 and 1, and level 2's delay and TTL cases.
# Cron (level 2), workflows (level 3) and part of level 4 come next; docs/jobs.md has the table.
def built(case) -> bool:
    return case.level in (0, 1) or (case.level == 2 and case.category in ("delay", "ttl"))


def suites_dir() -> Path | None:
    for candidate in (os.environ.get("OJS_CONFORMANCE_DIR"), ROOT.parent / "shared" / "ojs-conformance",
                      ROOT / "shared" / "ojs-conformance"):
        if candidate and (Path(candidate) / "suites").is_dir():
            return Path(candidate) / "suites"
    return None


SUITES = suites_dir()
CASES = [c for c in load_cases(SUITES) if built(c)] if SUITES else []


_FAILED_START: list[str] = []


@pytest.fixture(scope="module")
def ojs_server(tmp_path_factory):
    if _FAILED_START:
        pytest.fail(_FAILED_START[0])
    nats = NatsServer(tmp_path_factory.mktemp("ojs") / "nats")
    nats.start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    env.update(SEAMQ_NATS__URL=nats.url, SEAMQ_LOG_LEVEL="warning")
    log = open(tmp_path_factory.mktemp("ojs-log") / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "seamq", "jobs", "serve", "--port", str(port), "--test-mode"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/ojs/v1/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    _FAILED_START.append(f"seamq jobs serve did not start:\n{Path(log.name).read_text()[-3000:]}")
                    pytest.fail(_FAILED_START[0])
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        nats.kill()


def test_the_conformance_suite_is_there():
    assert SUITES is not None, (
        "the OJS conformance suite was not found: expected ../shared/ojs-conformance beside the clone "
        "(as in CI) or OJS_CONFORMANCE_DIR pointing at a checkout of openjobspec/ojs-conformance v0.4.0")
    assert len(load_cases(SUITES)) == 133


@pytest.mark.parametrize("case", CASES, ids=[c.path for c in CASES])
def test_conformance_case(ojs_server, case):
    runner = Runner(ojs_server, strict=True, reset_url=f"{ojs_server}/ojs/v1/admin/reset")

    async def one():
        import aiohttp

        async with aiohttp.ClientSession(timeout=runner.timeout) as session:
            return await runner.run_case(session, case)

    result = asyncio.run(one())
    assert result.status == "pass", f"{case.test_id} {case.path}:\n" + "\n".join(result.failures)
