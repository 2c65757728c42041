"""seamq.testing as a user meets it: one line in a conftest.py, handler tests with no services."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from seamq import Event, Poison
from seamq.registry import Registry, Route
from seamq.testing import Harness

KIT = Path(__file__).parent / "kit_project"


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
    assert "4 passed" in result.stdout


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
