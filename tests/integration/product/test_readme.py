"""The README's code blocks, run as a user would: the Python blocks in order, in one namespace,
against a real database, with only what the README says is the user's own (`dsn`, an `orders`
table and an order's id); the shell commands parsed as seamq's CLI parses them; the two commands
at the top as make targets. The testing section's blocks run as a project of their own
(tests/integration/messaging/test_testing_kit.py), and docs/first-app.md as a walkthrough (tests/integration/product/test_first_app.py)."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import psycopg

from seamq.testing import Harness

from helpers import scalar
from helpers.cli import parse_command

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
TESTING = README[README.index("### Testing your handlers"):README.index("An HTTP handler service is tested")]


def test_the_two_commands_are_make_targets():
    first = BLOCKS[0][1]
    assert "make run" in first and "make test" in first
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)


def test_every_python_block_runs_in_order(dsn):
    order_id = uuid.uuid4()
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id uuid PRIMARY KEY, state text)")
        conn.execute("INSERT INTO orders VALUES (%s, 'new')", (order_id,))
    namespace = {"dsn": dsn, "order_id": order_id, "__name__": "readme"}
    tests = []
    for lang, text in BLOCKS:
        if lang != "python" or text in TESTING:
            continue
        exec(compile(text, "README.md", "exec"), namespace)
        tests += [name for name in re.findall(r"^async def (test_\w+)", text, re.M)]
    assert scalar(dsn, "SELECT state FROM orders") == "paid"
    assert scalar(dsn, "SELECT count(*) FROM outbox_events WHERE context = 'ojs'") == 1  # the job
    assert scalar(dsn, "SELECT count(*) FROM outbox_events") == 3  # with the order's event and the typed one
    assert tests == ["test_a_negative_total_is_dead_lettered"]
    for name in tests:  # a test of the README's, with the harness its fixture gives
        asyncio.run(namespace[name](Harness()))


def test_every_command_of_run_the_parts_yourself_parses():
    section = README[README.index("## Run the parts yourself"):]
    commands = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    seen = 0
    for line in commands.splitlines():
        command = line.split("   #")[0].split("  #")[0].strip()
        if command.startswith("seamq "):
            parse_command(command.split())
            seen += 1
    assert seen >= 15


def test_the_other_docs_commands_parse_and_their_manifest_is_valid(tmp_path):
    """docs/jobs.md's commands as the CLI parses them; docs/operations.md's manifest as the registry
    reads it (deploy.md and first-app.md have tests of their own)."""
    from psycopg.conninfo import conninfo_to_dict

    from seamq.registry import read_manifests
    from seamq.settings import Settings

    jobs = (ROOT / "docs" / "jobs.md").read_text()
    commands = [line.split("  #")[0].strip() for block in re.findall(r"```sh\n(.*?)```", jobs, re.S)
                for line in block.splitlines() if line.startswith("seamq ")]
    assert len(commands) == 10
    for command in commands:
        parse_command(command.split())
    operations = (ROOT / "docs" / "operations.md").read_text()
    [failover] = re.findall(r"```sh\nSEAMQ_DATABASE_URL='(.*?)'\n```", operations)  # as libpq reads it
    parsed = conninfo_to_dict(Settings(database_url=failover).database_dsn())
    assert (parsed["host"], parsed["port"], parsed["target_session_attrs"]) == ("db1,db2", "5432,5432", "read-write")
    [manifest] = re.findall(r"```yaml\n(.*?)```", operations, re.S)
    (tmp_path / "sea.yaml").write_text(manifest)
    routes = read_manifests(tmp_path)
    assert [(r.context, r.event_type, r.version) for r in routes] == [("sea", "vibe_created", 1),
                                                                      ("sea", "vibe_created", 2)]
