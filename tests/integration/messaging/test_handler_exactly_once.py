"""An HTTP handler slower than the consumer's timeout, with its record in its own database
(seamq.http.handled): the consumer gives up on the first call and sends the message again while
the first call still runs. The side effect happens once per message, and the message is not
dead-lettered for it; without the record the same handler runs twice (at least once)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psycopg
import pytest

from seamq.embedded import free_port

from helpers import wait_for
from helpers.consumer import consuming, inbox, publish, vibe

SERVICE = """
    import asyncio, os
    from pathlib import Path

    from seamq.http.server import handler_app

    CALLS = Path(os.environ["CALLS_FILE"])


    async def bill(envelope, conn):
        with CALLS.open("a") as calls:  # every time the function starts, outside any transaction
            calls.write(f"{envelope.message_id}\\n")
        await asyncio.sleep(float(os.environ["SLOW"]))
        await conn.execute("INSERT INTO billed (order_id) VALUES (%s)", (envelope.aggregate_id,))


    async def bill_without_record(envelope):
        with CALLS.open("a") as calls:
            calls.write(f"{envelope.message_id}\\n")
        await asyncio.sleep(float(os.environ["SLOW"]))
        with psycopg.connect(os.environ["HANDLER_DB"], autocommit=True) as conn:
            conn.execute("INSERT INTO billed (order_id) VALUES (%s)", (envelope.aggregate_id,))


    import psycopg
    app = (handler_app(bill, secret=None, database_url=os.environ["HANDLER_DB"]) if os.environ["RECORD"] == "1"
           else handler_app(bill_without_record, secret=None))
"""


def serve(tmp_path, dsn: str, record: bool) -> tuple[subprocess.Popen, str]:
    (tmp_path / "billing_service.py").write_text(textwrap.dedent(SERVICE))
    port = free_port()
    env = {"CALLS_FILE": str(tmp_path / "calls.txt"), "SLOW": "4", "HANDLER_DB": dsn, "RECORD": str(int(record)),
           "PATH": "/usr/bin:/bin"}
    log = open(tmp_path / "service.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "billing_service:app", "--port", str(port),
                             "--host", "127.0.0.1"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "Application startup complete" not in (tmp_path / "service.log").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "service.log").read_text()
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/handle"


@pytest.mark.parametrize("record", [True, False], ids=["recorded-in-the-handlers-db", "at-least-once"])
async def test_a_handler_past_its_timeout_runs_its_side_effect_once_with_its_record(tmp_path, dsn, nats_server, nc,
                                                                                    topo, record):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE billed (order_id text NOT NULL)")  # no unique key: a second bill would show
    proc, url = serve(tmp_path, dsn, record)
    events = [vibe(f"order-{n}", n=n) for n in range(3)]
    try:
        # The consumer waits 1 s for a call that takes 4 s, then sends the message again (nak 0.1-0.5 s).
        async with consuming(dsn, nats_server.url, topo, handler_url=url, handler_timeout=1.0):
            await publish(nc.jetstream(), events)
            await wait_for(lambda: all(inbox(dsn, e.id).get("status") in ("processed", "dead_lettered")
                                       for e in events), timeout=120, what="every order settled")
    finally:
        proc.terminate()
        proc.wait(30)
    with psycopg.connect(dsn) as conn:
        billed = sorted(r[0] for r in conn.execute("SELECT order_id FROM billed"))
    calls = (tmp_path / "calls.txt").read_text().split()
    answers = (tmp_path / "service.log").read_text()
    if record:
        assert billed == [e.aggregate_id for e in events], billed  # each order billed once
        assert sorted(calls) == sorted(str(e.id) for e in events), calls  # and its function started once
        # Sent again, and answered without running: 423 while the first call ran, 409 once it had committed.
        again = answers.count('"POST /handle HTTP/1.1" 423') + answers.count('"POST /handle HTTP/1.1" 409')
        assert again >= len(events), answers[-2000:]
        assert all(inbox(dsn, e.id)["status"] == "processed" for e in events)  # none dead-lettered for it
    else:  # what a handler without its record gets: a second run alongside the first
        assert len(calls) > len(events) and len(billed) > len(events), (calls, billed)


def test_only_a_second_required_parameter_asks_for_the_connection():
    """A handler written before the record existed, with a defaulted second parameter of its own,
    still starts without a database_url; one that needs `conn` is refused at start without it."""
    from seamq.http.server import handler_app

    async def old(envelope, extra=None):
        return None

    async def needs_conn(envelope, conn):
        return None

    assert handler_app(old, secret=None) is not None
    with pytest.raises(TypeError, match="takes a connection"):
        handler_app(needs_conn, secret=None)
