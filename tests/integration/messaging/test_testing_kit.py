"""seamq.testing as a user meets it: one line in a conftest.py, handler tests with no services."""

from __future__ import annotations

import shutil
import subprocess
import sys

import psycopg
import pytest

from seamq import Envelope, Event, EventModel, Poison
from seamq.registry import Registry, Route
from seamq.testing import Harness
from helpers import HELPERS, ROOT

KIT = HELPERS / "kit_project"


def run_kit(tmp_path, tests: str) -> subprocess.CompletedProcess:
    """A project of the user's own: their modules and the one line in conftest.py; no SEAMQ_* settings."""
    for name in ("shop.py", tests):
        shutil.copy(KIT / name, tmp_path / name)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["seamq.testing"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


def test_a_users_handler_tests_run_with_one_line_and_no_services(tmp_path):
    result = run_kit(tmp_path, "shop_tests.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout


def test_the_kits_service_fixtures_start_migrate_and_provision(tmp_path):
    result = run_kit(tmp_path, "services_tests.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


async def record(envelope, conn) -> None:
    await conn.execute("INSERT INTO handled (message_id, n) VALUES (%s, %s)",
                       (envelope.message_id, envelope.payload["n"]))
    if envelope.payload["n"] < 0:
        raise Poison("n must not be negative")


def event(n) -> Event:
    return Event(context="vibespro", aggregate_type="vibe", aggregate_id="v-1", event_type="vibe_created",
                 payload={"n": n})


async def test_with_a_real_connection_the_handlers_writes_commit_only_when_acked(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE handled (message_id uuid, n int)")
    harness = Harness()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        ok = await harness.deliver(record, event(1), conn=conn)
        bad = await harness.deliver(record, event(-1), conn=conn)
    assert ok.acked and ok.committed and bad.dead_lettered and not bad.committed
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT n FROM handled").fetchall() == [(1,)]  # the poison's insert rolled back


async def test_a_registry_route_checks_its_schema_and_an_unrouted_event_has_no_handler():
    registry = Registry(routes=(Route("vibe_created", 1, record, schema='{"type":"object","required":["n"],'
                                      '"properties":{"n":{"type":"integer"}}}'),))
    harness = Harness()
    wrong = await harness.deliver(registry, event("one"))
    assert wrong.reason == "schema_mismatch" and "n" in wrong.detail and wrong.result.detail.startswith("n:")
    other = Event(context="vibespro", aggregate_type="vibe", aggregate_id="v", event_type="vibe_deleted", payload={})
    assert (await harness.deliver(registry, other)).reason == "no_handler"


async def test_the_kit_is_the_real_consumer_a_failed_handler_runs_again_in_a_savepoint_and_writes_nothing():
    """Nothing of the lane's rules is the kit's own: a failing in-process handler is called again with
    `rerun` (the fast path rolled back), its writes of both calls vanish, and the dead letter is the
    one the consumer publishes."""
    import json

    calls = []

    async def refuses(envelope, conn):
        calls.append(envelope.rerun)
        await conn.execute("INSERT INTO handled VALUES (1)")
        raise Poison("not this one")

    out = await Harness().deliver(refuses, event(1))
    assert calls == [False, True]
    assert out.dead_lettered and out.statements == [] and not out.committed
    body = json.loads(out.dead_letter.payload)
    assert out.dead_letter.subject == "vibespro.dlq.vibespro.vibe_created.v1"
    assert body["reason"] == "handler_rejected" and body["detail"] == "not this one"
    assert body["message_id"] == str(out.envelope.message_id)
    ok = await Harness().deliver(record, event(1))
    assert ok.acked and ok.committed and len(ok.statements) == 1 and ok.dead_letter is None


@pytest.mark.parametrize("headers,reason", [({}, "missing_msg_id"), ({"Nats-Msg-Id": "x"}, "invalid_msg_id")])
async def test_hostile_messages_are_judged_as_the_consumer_judges_them(headers, reason):
    out = await Harness().deliver(record, message=("vibespro.event.vibe_created.v1", headers, b"{}"))
    assert out.dead_lettered and out.reason == reason and out.result is None


async def test_a_handler_that_overruns_is_retried():
    import asyncio

    async def slow(envelope, conn):
        await asyncio.sleep(10)

    out = await Harness(handler_timeout=0.05).deliver(slow, event(1))
    assert out.retried and "timed out" in out.detail and not out.committed


async def test_an_http_handler_service_is_judged_in_process_as_the_consumer_judges_it():
    """handler_app's answers, from a request posted to its ASGI app in process: the consumer's
    own request (signed, traced) and its own reading of the status codes."""
    import asyncio

    from seamq import AlreadyProcessed
    from seamq.http.server import handler_app

    seen = []

    async def on_event(envelope) -> None:
        seen.append(envelope)
        n = envelope.payload["n"]
        if n == 0:
            raise AlreadyProcessed("did that already")
        if n < 0:
            raise Poison("n must not be negative")
        if n == 13:
            raise RuntimeError("flaky")
        if n == 99:
            await asyncio.sleep(10)

    app = handler_app(on_event, secret="s3cret")
    harness = Harness(max_deliver=3, handler_timeout=0.2)
    deliver = lambda n, **kw: harness.deliver_http(app, event(n), secret="s3cret", **kw)  # noqa: E731
    ok = await deliver(1)
    assert ok.acked and ok.committed and ok.result.outcome.value == "ok" and seen[-1].payload == {"n": 1}
    assert seen[-1].message_id == ok.envelope.message_id and seen[-1].delivery_attempt == 1
    assert (await deliver(0)).result.outcome.value == "already_processed"
    bad = await deliver(-1)
    assert bad.dead_lettered and bad.reason == "handler_rejected" and "n must not be negative" in bad.detail
    flaky = await deliver(13)
    assert flaky.retried and flaky.detail.startswith("HTTP 500") and not flaky.committed
    last = await deliver(13, delivered=3)
    assert last.dead_lettered and last.reason == "max_deliver"
    slow = await deliver(99)
    assert slow.retried and slow.detail == "handler timed out after 0.2s"
    unsigned = await harness.deliver_http(app, event(1))  # a wrong secret must not dead-letter good messages
    assert unsigned.retried and unsigned.detail.startswith("HTTP 401")
    hostile = await harness.deliver_http(app, message=("vibespro.event.vibe_created.v1", {}, b"{}"))
    assert hostile.reason == "missing_msg_id" and hostile.result is None


class Scored(EventModel, context="vibespro", name="vibe_created", version=1):
    n: int


async def on_scored(envelope: Envelope[Scored]) -> None:
    assert isinstance(envelope.payload, Scored)


async def test_a_typed_http_service_dead_letters_a_payload_that_does_not_fit_as_schema_mismatch():
    from seamq.http.server import handler_app

    out = await Harness().deliver_http(handler_app(on_scored, secret=None), event("one"))
    assert out.dead_lettered and out.reason == "schema_mismatch" and "n" in out.detail
    assert (await Harness().deliver_http(handler_app(on_scored, secret=None), event(2))).acked


async def test_any_asgi_app_can_be_the_service_and_an_exception_it_lets_out_is_a_500():
    from fastapi import FastAPI

    plain = FastAPI()

    @plain.post("/events")
    async def handle() -> None:
        raise RuntimeError("boom")

    async def broken(scope, receive, send) -> None:
        raise RuntimeError("boom before answering")

    for app, path in ((plain, "/events"), (broken, "/handle")):
        out = await Harness().deliver_http(app, event(1), path=path)
        assert out.retried and out.detail.startswith("HTTP 500"), out.detail
    missing = await Harness().deliver_http(plain, event(1))  # nothing at /handle: 404, retried, not dead-lettered
    assert missing.retried and missing.detail.startswith("HTTP 404")


def test_the_readmes_testing_example_runs_as_written(tmp_path):
    """The README's harness example asserted statements it could not produce; now its blocks are a
    user's project: the conftest line, the pytest settings and the test module, as written."""
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Testing your handlers"):readme.index("An HTTP handler service is tested")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    conftest, settings, module = [text for _, text in blocks]
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "pyproject.toml").write_text(settings)
    name = module.splitlines()[0].removeprefix("# ").strip()
    (tmp_path / name).write_text(module)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180, env={"PATH": "/usr/bin:/bin",
                                                                              "HOME": str(tmp_path)})
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout + result.stderr
