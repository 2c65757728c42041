"""Network partitions (issue 47): a three-node NATS cluster, the relay and a consumer each on a host
of its own (tests/helpers/lab.py: network namespaces on one bridge), events written throughout.
The node the relay is connected to is cut off, then healed; then the consumer's. Each pause in
publishing and in handling is measured, and at the end everything is counted: nothing lost,
nothing handled twice, each aggregate handled in order."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from seamq import outbox
from seamq.embedded.postgres import PostgresServer
from seamq.pg import migrate

from conftest import SEAMQ
from helpers import scalar, wait_for
from helpers.lab import Lab, LabNats, need_namespaces
from helpers.relay import events_for, unpublished

CONSUMER = "sea__from_vibespro"
TOPOLOGY = """
contexts:
  sea: {}
  vibespro: {}
consumers:
  sea__from_vibespro: {ack_wait: 10s, max_deliver: 20, max_ack_pending: 500}
"""
# Seconds a node cut off may stop publishing or handling here. Issue 47's target is 10 s, and an idle
# machine shows 5-8 s (docs/operations.md, "A NATS cluster"); the bound the test holds is looser, so
# that a busy machine cannot fail it, and still tight enough to catch the 28 s stop it replaced.
PAUSE_BOUND = 20.0
GAPS = ("SELECT extract(epoch FROM prev), extract(epoch FROM t) FROM (SELECT t, lag(t) OVER (ORDER BY t) AS prev "
        "FROM (SELECT {column} AS t FROM {table} WHERE {column} IS NOT NULL) w) g WHERE t - prev > interval '1 second'")


def longest_pause(dsn: str, column: str, table: str, began: float, healed: float) -> float:
    """The longest time nothing was published (or handled) that overlaps the fault's span."""
    with psycopg.connect(dsn) as conn:
        gaps = conn.execute(GAPS.format(column=column, table=table)).fetchall()
    return max((float(t - prev) for prev, t in gaps if prev < healed and t > began), default=0.0)


@pytest.fixture
def postgres(tmp_path):
    sock = Path(tempfile.mkdtemp(prefix="sqpg-"))  # short: a socket's path has at most 107 bytes
    sock.chmod(0o755)
    server = PostgresServer(tmp_path / "pg", socket_dir=sock)
    try:
        server.start()
        yield server
    finally:
        server.remove_data()
        shutil.rmtree(sock, ignore_errors=True)


@pytest.mark.timeout(900)
async def test_a_node_cut_off_pauses_publishing_and_handling_briefly_and_loses_nothing(postgres, tmp_path):
    need_namespaces()
    dsn = postgres.socket_dsn()
    await migrate.upgrade(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE handled_order (id bigserial PRIMARY KEY, message_id uuid, aggregate_id text, "
                     "n int, pid int)")
    (tmp_path / "lab").mkdir()
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    with Lab(["n1", "n2", "n3", "relay", "consumer"], tmp_path / "lab") as lab:
        nats = LabNats(lab, ["n1", "n2", "n3"])
        nats.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
        env.update(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats.url, SEAMQ_TOPOLOGY_FILE=str(topology),
                   SEAMQ_REPLICAS="3", PYTHONPATH=str(Path(__file__).parent),
                   SEAMQ_CONSUMER__REGISTRY="inprocess_handlers:ORDER_REGISTRY", SEAMQ_CONSUMER__NAK_BASE="0.2")
        lab.run("relay", [*SEAMQ, "provision"], env)
        relay = lab.popen("relay", [*SEAMQ, "relay"], tmp_path / "relay.log", env)
        consumer = lab.popen("consumer", [*SEAMQ, "consume", "--consumer", CONSUMER], tmp_path / "consumer.log", env)
        events = events_for(200, 100, context="vibespro")
        written = 0

        async def produce():  # about 250 events/s until every fault is over, then the rest at once
            nonlocal written
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                while written < len(events):
                    await outbox.add_many_async(conn, events[written:written + 50])
                    await conn.commit()
                    written += 50
                    await asyncio.sleep(0 if done.is_set() else 0.2)

        async def cut_off(client: str) -> dict:
            """The node `client` is connected to, cut off for 20 s while events flow."""
            host = await asyncio.to_thread(nats.holding, client)
            assert host, f"{client} is connected to no node"
            began = time.time()
            lab.isolate(host)
            await asyncio.sleep(20)
            lab.heal(host)
            healed = time.time()
            await wait_for(lambda: nats.healthy(host), timeout=120, interval=1, what=f"{host} current again")
            await asyncio.sleep(10)  # events flow through the healed cluster before the next fault
            return {"node": host, "began": began, "healed": healed}

        done = asyncio.Event()
        producer = asyncio.create_task(produce())
        try:
            await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM handled_order") >= 1000, timeout=120,
                           what="the first events handled")
            pauses = {"relay's node": await cut_off("seamq-relay"),
                      "consumer's node": await cut_off(f"seamq-consumer-{CONSUMER}")}
            done.set()
            await producer
            await wait_for(lambda: unpublished(dsn) == 0, timeout=180, what="everything published")
            await wait_for(lambda: scalar(dsn, "SELECT count(DISTINCT message_id) FROM handled_order") >= len(events),
                           timeout=180, what="everything handled")
        finally:
            producer.cancel()
            for worker in (relay, consumer):
                worker.send_signal(signal.SIGTERM)
            exits = [worker.wait(30) for worker in (relay, consumer)]
    for fault in pauses.values():
        fault["publishing"] = longest_pause(dsn, "published_at", "outbox_events", fault["began"], fault["healed"])
        fault["handling"] = longest_pause(dsn, "processed_at", "inbox_messages", fault["began"], fault["healed"])
    print("\n" + "\n".join(f"{fault} ({p['node']}, {time.strftime('%H:%M:%S', time.gmtime(p['began']))}) cut off for 20 s: longest pause in publishing "
                           f"{p['publishing']:.1f} s, in handling {p['handling']:.1f} s" for fault, p in pauses.items()))
    assert exits == [0, 0]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT aggregate_id, n FROM handled_order ORDER BY id").fetchall()
        dead = conn.execute("SELECT count(*) FROM inbox_messages WHERE status <> 'processed'").fetchone()[0]
    assert len(rows) == len({(a, n) for a, n in rows}) == len(events) and dead == 0  # none lost, none twice
    last: dict[str, int] = {}
    for aggregate, n in rows:
        assert n > last.get(aggregate, -1), f"{aggregate} handled out of order: {n} after {last[aggregate]}"
        last[aggregate] = n
    slow = {f: p for f, p in pauses.items() if max(p["publishing"], p["handling"]) > PAUSE_BOUND}
    assert not slow, f"a node cut off stopped the flow for more than {PAUSE_BOUND} s: {slow}"
