"""The command line's contract: coded errors instead of tracebacks, documented exit codes."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import time
from pathlib import Path

import pytest

from seamq.cli.common import INPUT_ERRORS
from seamq.embedded import free_port
from seamq.model import ErrorCode

from helpers import SEAMQ

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()
ERRORS = (Path(__file__).resolve().parents[3] / "docs" / "errors.md").read_text()


def seamq(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    return subprocess.run([*SEAMQ, *args], env={**clean, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["db", "status"], ["db", "upgrade"], ["dlq", "list"], ["dlq", "purge", "--yes"],
                                     ["pipeline", "kpis"], ["pipeline", "reconcile"], ["backlog"]])
def test_no_database_configured_is_a_coded_error_not_a_traceback(command):
    result = seamq(*command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith("error[INVALID_CONFIG]: no database configured: set SEAMQ_DATABASE_URL")
    assert "Traceback" not in result.stderr and "log4j" not in result.stderr  # said before a JVM starts


def test_an_unreachable_database_names_itself_without_the_password():
    result = seamq("db", "status", SEAMQ_DATABASE_URL=f"postgresql://app:hunter2-secret@127.0.0.1:{_closed_port()}/x")
    assert result.returncode == 1 and "error[DATABASE_UNAVAILABLE]" in result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["backlog"], ["outbox", "parked"], ["db", "status"]])
def test_a_database_that_refuses_us_is_said_at_once_with_postgresqls_reason(pg_server, command):
    """A wrong database name: PostgreSQL's own reason, not "couldn't get a connection after 5.00 sec"."""
    dsn = pg_server.dsn("postgres").rsplit("/", 1)[0] + "/no_such_database"
    result = seamq(*command, SEAMQ_DATABASE_URL=dsn)
    assert result.returncode == 1 and "error[DATABASE_UNAVAILABLE]" in result.stderr, result.stderr
    assert 'database "no_such_database" does not exist' in " ".join(result.stderr.split()), result.stderr


def test_version():
    from importlib.metadata import version

    result = seamq("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"seamq {version('seamq')}"


def test_every_error_code_is_documented_with_its_exit_code():
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d) \|", ERRORS, re.M))
    assert "docs/errors.md" in README
    assert set(documented) == {code.value for code in ErrorCode}
    for code in ErrorCode:
        assert int(documented[code.value]) == (2 if code in INPUT_ERRORS else 1), code


_HELD: list[socket.socket] = []


def _closed_port() -> int:
    """A port where connections are refused for as long as the tests run: bound here and never
    listened on, so no other test's server can take it meanwhile (a free port, once handed out, was
    once taken by another worker's server, and `seamq audit` ran against it until killed)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    _HELD.append(held)
    return held.getsockname()[1]


def test_the_documented_registry_import_works_from_the_project_folder(tmp_path):
    """`seamq consume --registry registry_generated:REGISTRY`, run where `seamq registry generate`
    wrote the module, finds it without PYTHONPATH (the installed `seamq` script, not `python -m`)."""
    import sys

    (tmp_path / "registry_generated.py").write_text(
        "from seamq.registry import Registry\nREGISTRY = Registry(default='http://127.0.0.1:9/handle')\n")
    script = Path(sys.executable).parent / "seamq"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_") and k != "PYTHONPATH"}
    result = subprocess.run([str(script), "consume", "--consumer", "sea__from_vibespro", "--registry",
                             "registry_generated:REGISTRY"], cwd=tmp_path, env=clean, capture_output=True, text=True,
                            timeout=120)
    # Past the registry: what stops it now is the next thing it needs.
    assert "error[INVALID_CONFIG]: no database configured" in result.stderr, result.stderr


# Every command that needs a service, with what it needs. Commands that need neither (registry, asyncapi,
# monitoring) or bring their own (dev) are not here; a test below keeps this list complete.
NEEDS = {
    "backlog": ["db"], "consume --consumer sea__from_vibespro --handler-url http://127.0.0.1:9/handle": ["db", "nats"],
    "db status": ["db"], "db upgrade": ["db"], "dlq list": ["db"], "dlq purge --yes": ["db", "nats"],
    "dlq replay --all": ["db"],  # NATS only once there is something to replay
    "dlq show 00000000-0000-0000-0000-000000000001": ["db"],  # NATS only once there is something to show
    "inbox purge --older-than 7d": ["db"], "inbox show 00000000": ["db"], "outbox purge --older-than 7d": ["db"],
    "outbox parked": ["db"], "outbox move --context shopp --to shop": ["db"], "outbox retry --context shopp": ["db"],
    "outbox drop --context shopp --yes": ["db"], "jobs serve --port {port}": ["nats"],
    "jobs worker --url http://127.0.0.1:{port} --queue q --handler json:dumps": ["nats"],
    "jobs list --url http://127.0.0.1:{port}": ["jobs"], "jobs show x --url http://127.0.0.1:{port}": ["jobs"],
    "jobs retry --all --url http://127.0.0.1:{port}": ["jobs"],
    "jobs cancel --all --yes --url http://127.0.0.1:{port}": ["jobs"],  # the job server's admin API
    "pipeline kpis": ["db"], "pipeline reconcile": ["db", "nats"], "pipeline lake --stream SEA_EVENTS": ["nats"],
    "pipeline replay --since 2026-01-01 --until 2026-01-02 --lake lake": ["nats"],
    "provision": ["nats"], "relay": ["db", "nats"], "replay": ["db", "nats"], "audit": ["db", "nats"],
    "audit --once": ["db", "nats"], "console --port {port}": ["db"],  # it starts without NATS: test_console
}
SERVICE_FREE = {"asyncapi", "dev", "monitoring dashboard", "monitoring rules", "registry check", "registry generate"}


def test_the_matrix_names_every_command():
    import typer.main

    from seamq.cli import app

    def leaves(command, path=()):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from leaves(sub, (*path, name))
        else:
            yield " ".join(path)

    named = {" ".join(c.split()[:2]) if c.split()[0] in ("db", "dlq", "inbox", "outbox", "jobs", "pipeline")
             else c.split()[0] for c in NEEDS}
    assert set(leaves(typer.main.get_command(app))) == named | SERVICE_FREE


def _timed(argv: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """A command's result, its wall time and the CPU time it used (its own and its children's)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


@pytest.mark.parametrize("scenario", ["nothing configured", "database unreachable", "nats unreachable"])
def test_every_command_without_its_service_ends_in_a_coded_error_within_10s(scenario, tmp_path, request):
    """Each command whose service is missing or away: `error[CODE]` with its documented exit code, and
    an end within 10 s (the subprocess' timeout), never a traceback or a hang."""
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d) \|", ERRORS, re.M))
    env = {}
    if scenario != "nothing configured":  # the other service is up, so the missing one is what fails
        dsn, nats = request.getfixturevalue("dsn"), request.getfixturevalue("nats_server").url
        env = dict(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats)
        down = "db" if scenario == "database unreachable" else "nats"
        env["SEAMQ_DATABASE_URL" if down == "db" else "SEAMQ_NATS__URL"] = (
            f"postgresql://app:pw@127.0.0.1:{_closed_port()}/x" if down == "db" else f"nats://127.0.0.1:{_closed_port()}")
    (tmp_path / "lake" / "context=sea").mkdir(parents=True)  # so lake replay gets as far as NATS
    # 10 s is what a command may wait, for services and their timeouts. Its own work (starting Python,
    # importing) comes on top at the speed the machine has right now: its CPU seconds times how many
    # seconds a CPU second takes now, timed on a command that waits for nothing. So a busy machine
    # fails nothing, and a command that waits too long fails on any machine.
    _, wall, cpu = _timed([*SEAMQ, "monitoring", "rules"], timeout=120)
    slowdown = max(1.0, wall / max(cpu, 0.01))
    failures = []
    for command, needs in NEEDS.items():
        if scenario != "nothing configured" and down not in needs:
            continue
        args = command.format(port=free_port()).split()  # a port to listen on
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
        try:
            result, wall, cpu = _timed([*SEAMQ, *args], env={**clean, **env}, timeout=120, cwd=tmp_path)
        except subprocess.TimeoutExpired:
            failures.append(f"{command}: still running after 120 s")
            continue
        if wall - 1.5 * cpu * slowdown > 10:  # the machine may have become busier since: time it again
            _, probe_wall, probe_cpu = _timed([*SEAMQ, "monitoring", "rules"], timeout=120)
            slowdown = max(slowdown, probe_wall / max(probe_cpu, 0.01))
        if wall - 1.5 * cpu * slowdown > 10:
            failures.append(f"{command}: waited {wall - cpu * slowdown:.1f} s ({wall:.1f} s in all, {cpu:.1f} s of CPU)")
        found = re.search(r"error\[([A-Z_]+)\]", result.stderr)
        if "error connecting in" in result.stderr:  # psycopg's pool said it six times before the coded line
            failures.append(f"{command}: the pool's own warnings: {result.stderr[:300]!r}")
        elif not found or "Traceback" in result.stderr or found[1] == "INTERNAL":
            failures.append(f"{command}: exit {result.returncode}, {result.stderr[-300:]!r}")
        elif int(documented.get(found[1], -1)) != result.returncode:
            failures.append(f"{command}: error[{found[1]}] exited {result.returncode}, documented "
                            f"{documented.get(found[1])}")
    assert failures == []


def test_json_output_for_scripts(dsn, nats_server, tmp_path):
    """--json prints one JSON document with whole ids and ISO times, whatever the terminal."""
    import json
    import uuid

    import psycopg

    from helpers.consumer import CONSUMER

    env = dict(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats_server.url)
    plan = json.loads(seamq("provision", "--dry-run", "--json", **env).stdout)
    assert any(c["name"] == "SEA_EVENTS" and c["action"] == "create" for c in plan)
    assert seamq("provision", **env).returncode == 0
    assert all(c["action"] == "unchanged" for c in json.loads(seamq("provision", "--dry-run", "--json", **env).stdout))

    dead = uuid.uuid4()
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO inbox_messages (message_id, subject, consumer, status, attempts, dlq_metadata) "
                     "VALUES (%s, 'vibespro.event.vibe_created.v1', %s, 'dead_lettered', 3, %s)",
                     (dead, CONSUMER, json.dumps({"reason": "handler_rejected", "detail": "no"})))
    [row] = json.loads(seamq("dlq", "list", "--json", **env).stdout)
    assert row["message_id"] == str(dead) and row["dlq_metadata"]["reason"] == "handler_rejected"
    [shown] = json.loads(seamq("dlq", "show", str(dead), "--json", **env).stdout)
    assert shown["message_id"] == str(dead) and "dlq_copy" in shown
    status = json.loads(seamq("db", "status", "--json", **env).stdout)
    _people_find_a_message_by_the_start_of_its_id_and_see_every_failed_attempt(dsn, env, dead)
    assert status[0]["version"] == 1 and status[0]["applied_at"].startswith("20")
    backlog = json.loads(seamq("backlog", "--json", **env).stdout)
    assert set(backlog) == {"outbox", "inbox"}
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "m.yaml").write_text(
        "context: sea\nsubscriptions:\n  - {event: e, source: vibespro, versions: {1: {handler: 'a:b'}}}\n")
    checked = subprocess.run([*SEAMQ, "registry", "check", "--json"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 1 and json.loads(checked.stdout)["up_to_date"] is False


def test_a_worker_command_collects_garbage_less_often_than_python_would():
    """10% of a consumer's CPU went to the collector walking objects that live as long as the process.
    And its PostgreSQL sessions carry its name (the relay's test finds its processes by it)."""
    import gc
    from unittest import mock

    from seamq.cli import workers
    from seamq.settings import Settings

    seen = {}

    async def worker(stop, health) -> None:
        seen["threshold"], seen["frozen"] = gc.get_threshold(), gc.get_freeze_count()
        seen["name"] = os.environ["PGAPPNAME"]

    before = gc.get_threshold()
    try:
        with mock.patch.dict(os.environ):  # as it was after the test: later tests' subprocesses inherit it
            os.environ.pop("PGAPPNAME", None)
            workers._serve(Settings(), "test", worker)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    assert seen["threshold"][0] >= 10_000 > before[0] and seen["frozen"] > 0
    assert seen["name"] == f"seamq test pid {os.getpid()}"


def _people_find_a_message_by_the_start_of_its_id_and_see_every_failed_attempt(dsn, env, dead):
    """`dlq list` shows ids cut; `dlq show` refused the cut id. Failed attempts were not kept after a
    retry succeeded. Purged dead letters stayed in `dlq list` as "exhausted"."""
    import json
    import uuid

    import psycopg

    from helpers.consumer import CONSUMER

    handled, twin_a, twin_b = uuid.uuid4(), uuid.UUID("abcd0000-0000-4000-8000-000000000001"), \
        uuid.UUID("abcd0000-0000-4000-8000-000000000002")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO inbox_attempts (consumer, message_id, attempt, error) VALUES (%s, %s, 1, 'HTTP 500: a'),"
                     " (%s, %s, 2, 'HTTP 500: b')", (CONSUMER, dead, CONSUMER, dead))
        for message_id, status in [(handled, "processed"), (twin_a, "dead_lettered"), (twin_b, "dead_lettered")]:
            conn.execute("INSERT INTO inbox_messages (message_id, subject, consumer, status, attempts, last_error, "
                         "dlq_metadata) VALUES (%s, 's', %s, %s, 2, 'HTTP 503', '{\"reason\": \"max_deliver\"}')",
                         (message_id, CONSUMER, status))
        conn.execute("INSERT INTO inbox_attempts (consumer, message_id, attempt, error) VALUES (%s, %s, 1, 'HTTP 503')",
                     (CONSUMER, handled))
    [shown] = json.loads(seamq("dlq", "show", str(dead)[:8], "--json", **env).stdout)
    assert shown["message_id"] == str(dead)
    assert [(a["attempt"], a["error"]) for a in shown["failed_attempts"]] == [(1, "HTTP 500: a"), (2, "HTTP 500: b")]
    ambiguous = seamq("dlq", "show", "abcd", **env)
    assert ambiguous.returncode != 0 and "error[INVALID_CONFIG]: abcd names 2 dead letters" in ambiguous.stderr
    assert "error[INVALID_CONFIG]" in seamq("dlq", "show", "xyz!", **env).stderr
    [row] = json.loads(seamq("inbox", "show", str(handled)[:13] + "...", "--json", **env).stdout)
    assert (row["status"], row["last_error"], [a["error"] for a in row["failed_attempts"]]) == \
        ("processed", "HTTP 503", ["HTTP 503"])
    assert "attempt 1" in seamq("inbox", "show", str(handled), **env).stdout
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE inbox_messages SET status = 'exhausted', dlq_metadata = dlq_metadata || "
                     "'{\"purged_at\": \"2026-01-01\"}' WHERE message_id = %s", (twin_a,))
    listed = {r["message_id"] for r in json.loads(seamq("dlq", "list", "--json", **env).stdout)}
    assert str(twin_a) not in listed and str(twin_b) in listed, "purged ones are hidden by default"
    assert "purged" in seamq("dlq", "list", "--purged", **env).stdout


@pytest.mark.parametrize("argv, module, extra", [
    (["jobs", "serve", "--port", "9"], "uvicorn", "jobs"), (["dev"], "uvicorn", "embedded"),
    (["pipeline", "kpis"], "pyspark", "pipeline")])
def test_a_missing_extra_is_named_with_the_install_command_not_a_traceback(argv, module, extra, tmp_path):
    """With only seamq[worker], these printed a 30-line traceback ending in error[INTERNAL]: ModuleNotFoundError."""
    missing = tmp_path / "missing" / module
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text(f"raise ModuleNotFoundError({'No module named ' + module!r}, name={module!r})\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    result = subprocess.run([*SEAMQ, *argv], env={**clean, "PYTHONPATH": str(tmp_path / "missing")}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-500:]
    assert f"this command needs the {extra} extra ({module} is not installed): pip install 'seamq[{extra}]'" in \
        " ".join(result.stderr.split())


def test_jobs_serve_on_a_busy_port_says_so_with_its_own_code(nats_server):
    """It exited 3, the code documented for destructive changes, with uvicorn's log line."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = seamq("jobs", "serve", "--port", str(port), SEAMQ_NATS__URL=nats_server.url)
    assert result.returncode == 1 and f"error[PORT_IN_USE]: 127.0.0.1:{port} is in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_worker_stopped_with_ctrl_c_exits_130_and_with_sigterm_0(dsn, nats_server, tmp_path):
    """The README documents 130 for an interrupted command; the relay exited 0 on SIGINT."""
    import signal
    import time

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    env = {**clean, "SEAMQ_DATABASE_URL": dsn, "SEAMQ_NATS__URL": nats_server.url}
    assert seamq("provision", SEAMQ_NATS__URL=nats_server.url).returncode == 0
    codes = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        log = tmp_path / f"relay-{sig}.log"
        with open(log, "w") as out:
            relay = subprocess.Popen([*SEAMQ, "relay"], env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "relay_started" not in log.read_text() and time.monotonic() < deadline and relay.poll() is None:
            time.sleep(0.1)
        relay.send_signal(sig)
        codes.append(relay.wait(30))
    assert codes == [130, 0]
