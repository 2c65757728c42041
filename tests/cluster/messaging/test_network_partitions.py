"""Network partitions (issue 47): a three-node NATS cluster, the relay and a consumer each on a host
of its own (tests/helpers/lab.py: network namespaces on two bridges, one for clients and one for the
servers' routes), 20,000 events over 200 aggregates written throughout, 0.1% of them poison. One
fault after another: the relay's node cut off, the consumer's, the stream leader's, the consumer
leader's; the stream leader split from its peers while its clients still reach it; the consumer's
host cut off from every node while it holds unacknowledged messages; the relay's node flapping. Each
pause in publishing and in handling is measured, and at the end everything is counted: nothing lost,
nothing handled twice, each aggregate handled in order, every poison event a dead letter and no other;
and `seamq audit --once` finds nothing missing. `seamq audit` runs throughout: an event the broker
acknowledged and then lost is published again from its row, and it alone may come after later events
of its aggregate.
"""

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
from seamq.model import Event
from seamq.pg import migrate

from helpers import SEAMQ, TESTS
from helpers import FAILOVER_TOPOLOGY, longest_pause, scalar, wait_for
from helpers.lab import Lab, LabNats, need_namespaces
from helpers.relay import unpublished

STREAM, CONSUMER = "VIBESPRO_EVENTS", "sea__from_vibespro"
CUT = 15  # seconds each fault lasts
ROUNDS = int(os.environ.get("SEAMQ_LAB_ROUNDS", "1"))  # `make soak`: the sequence again and again, more events
# Seconds a single node cut off may stop publishing or handling. Issue 47's target is 10 s, and an
# idle machine shows 5-9 s (docs/operations.md, "A NATS cluster"). How long JetStream takes to elect
# leaders depends on the machine's speed (26 s once in CI on a busy shared machine), so `make test`
# measures and prints the pauses and holds only that the flow comes back after each fault; `make
# soak`, run on a machine of its own, holds these bounds.
HOLD_BOUNDS = ROUNDS > 1
PAUSE_BOUND = 20.0
# A split leader that also leads the consumer: nats-server took 16-23 s to settle the consumer's next
# leader in two runs (its logs: leaders elected and stalled again while the meta leader was away), and
# nothing can be handled before it has one. docs/benchmarks.md 1d.
SPLIT_BOUND = 40.0
HANDLED = "SELECT count(*) FROM handled_order"
def events(aggregates: int, per_aggregate: int) -> list[Event]:
    """Event n of every aggregate, then n+1; one in a thousand poison."""
    return [Event(context="vibespro", aggregate_type="order", aggregate_id=f"o-{a}", event_type="order_updated",
                  payload={"aggregate": a, "n": n, **({"poison": True} if (n * aggregates + a) % 1000 == 999 else {})})
            for n in range(per_aggregate) for a in range(aggregates)]


async def provision(lab: Lab, env: dict, timeout: float = 120) -> None:
    """`seamq provision` from inside the lab; refused while a node is not yet known to the others
    (error[BROKER_UNAVAILABLE]: no suitable peers for placement), it is run again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lab.run("relay", [*SEAMQ, "provision"], env)
            return
        except AssertionError as exc:
            if "BROKER_UNAVAILABLE" not in str(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(1)


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


@pytest.mark.timeout(1800)
async def test_one_partition_after_another_loses_nothing_doubles_nothing_and_keeps_each_aggregates_order(
        postgres, tmp_path):
    need_namespaces()
    dsn = postgres.socket_dsn()
    await migrate.upgrade(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE handled_order (id bigserial PRIMARY KEY, message_id uuid, aggregate_id text, "
                     "n int, pid int)")
    (tmp_path / "lab").mkdir()
    topology = tmp_path / "topology.yaml"
    topology.write_text(FAILOVER_TOPOLOGY)
    written, todo = 0, events(200, 100 * ROUNDS)
    poison = {e.id for e in todo if e.payload.get("poison")}
    with Lab(["n1", "n2", "n3", "relay", "consumer"], tmp_path / "lab", servers=["n1", "n2", "n3"]) as lab:
        nats = LabNats(lab, ["n1", "n2", "n3"])
        nats.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
        env.update(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats.url, SEAMQ_TOPOLOGY_FILE=str(topology),
                   SEAMQ_REPLICAS="3", PYTHONPATH=str(TESTS),
                   SEAMQ_CONSUMER__REGISTRY="helpers.inprocess_handlers:ORDER_POISON_REGISTRY", SEAMQ_CONSUMER__NAK_BASE="0.2")
        # One consumer process, which counts itself alone (seamq.nats.members): a delivery a route drops
        # with no fault it sees is then a loss, held for.
        await provision(lab, env)
        leaders = lambda: nats.leaders(STREAM, CONSUMER, "relay", env)  # noqa: E731

        async def holding(name: str) -> str:  # the node a client is connected to, once it is
            return await wait_for(lambda: asyncio.to_thread(nats.holding, name), timeout=60, interval=1,
                                  what=f"{name} connected")

        async def leader(which: int) -> str:  # 0: the stream's, 1: the consumer's; once one is elected
            async def now():
                return (await asyncio.to_thread(leaders))[which]
            return await wait_for(now, timeout=60, interval=1, what="a leader elected")
        # The consumer on its leader's node, the relay on another: the first fault cuts the relay's
        # node alone, the second the consumer's.
        consumer_leader = await leader(1)
        relay_node = next(h for h in nats.hosts if h != consumer_leader)
        consumer = lab.popen("consumer", [*SEAMQ, "consume", "--consumer", CONSUMER], tmp_path / "consumer.log",
                             {**env, "SEAMQ_NATS__URL": nats.url_of(consumer_leader)})
        relay = lab.popen("relay", [*SEAMQ, "relay"], tmp_path / "relay.log",
                          {**env, "SEAMQ_NATS__URL": nats.url_of(relay_node)})
        # The audit runs throughout, as in a deployment: what the broker acknowledged and then lost
        # (it happened: 15 events of one relay batch at a split, CI 2026-11-29) is found and published
        # again from its row.
        auditor = lab.popen("relay", [*SEAMQ, "audit"], tmp_path / "audit.log",
                            {**env, "SEAMQ_AUDIT__SETTLE": "10", "SEAMQ_AUDIT__INTERVAL": "1"})

        async def produce():  # writers throughout: 100 events/s, 20/s for the last fifth, the rest once healed
            nonlocal written
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                while written < len(todo):
                    await outbox.add_many_async(conn, todo[written:written + 20])
                    await conn.commit()
                    written += 20
                    await asyncio.sleep(0 if done.is_set() else 0.2 if written < 0.8 * len(todo) else 1.0)

        async def flap(host: str) -> None:
            for _ in range(CUT // 2):
                lab.isolate(host)
                await asyncio.sleep(1)
                lab.heal(host)
                await asyncio.sleep(1)

        async def fault(name: str, host: str | None, how) -> dict:
            assert host, f"{name}: no such node now"
            began = time.time()
            if how == "flap":
                await flap(host)
            else:
                getattr(lab, how)(host)
                await asyncio.sleep(CUT)
                lab.heal(host)
            healed = time.time()
            await wait_for(lambda: all(nats.healthy(h) for h in nats.hosts), timeout=180, interval=1,
                           what=f"every node current after {name}")
            handled = scalar(dsn, HANDLED)  # events flow through the healed cluster before the next fault
            await wait_for(lambda: scalar(dsn, HANDLED) >= min(handled + 1000, len(todo) - len(poison)), timeout=180,
                           interval=0.5, what=f"events handled after {name}")
            return {"fault": name, "node": host, "began": began, "healed": healed}

        done = asyncio.Event()
        producer = asyncio.create_task(produce())
        faults = []
        try:
            await wait_for(lambda: scalar(dsn, HANDLED) >= 1000, timeout=120,
                           what="the first events handled")
            await wait_for(lambda: nats.holding("seamq-relay") == relay_node, timeout=60, interval=1,
                           what="the relay on its node")
            for _ in range(ROUNDS):
                faults.append(await fault("the relay's node cut off", await holding("seamq-relay"), "isolate"))
                faults.append(await fault("the consumer's node cut off", await holding(
                    f"seamq-consumer-{CONSUMER}"), "isolate"))
                faults.append(await fault("the stream leader cut off", await leader(0), "isolate"))
                faults.append(await fault("the consumer leader cut off", await leader(1), "isolate"))
                faults.append(await fault("the stream leader split from its peers, its clients still with it",
                                          await leader(0), "split"))
                faults.append(await fault("the consumer's host cut off from every node, holding unacked messages",
                                          "consumer", "isolate"))
                faults.append(await fault("the relay's node flapping (1 s off, 1 s on)", await holding("seamq-relay"),
                                          "flap"))
            done.set()
            await producer
            await wait_for(lambda: unpublished(dsn) == 0, timeout=300, what="everything published")
            await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE status IN "
                                               "('processed', 'dead_lettered')") >= len(todo),
                           timeout=300, what="everything handled or dead-lettered")
        finally:
            producer.cancel()
            for worker in (relay, consumer, auditor):
                worker.send_signal(signal.SIGTERM)
            exits = [worker.wait(30) for worker in (relay, consumer, auditor)]
        # The audit, from nothing, finds nothing missing: every published row in the stream, every
        # event with its row, every acked message finished in the inbox (exit 3 and the list if not).
        print(lab.run("relay", [*SEAMQ, "audit", "--once"], {**env, "SEAMQ_AUDIT__SETTLE": "0"}, timeout=600))
    for f in faults:
        f["publishing"] = longest_pause(dsn, "published_at", "outbox_events", f["began"], f["healed"])
        f["handling"] = longest_pause(dsn, "processed_at", "inbox_messages", f["began"], f["healed"])
        print(f"\n{f['fault']} ({f['node']}, {time.strftime('%H:%M:%S', time.gmtime(f['began']))}, {CUT} s): "
              f"longest pause in publishing {f['publishing']:.1f} s, in handling {f['handling']:.1f} s")
    assert exits == [0, 0, 0]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT aggregate_id, n, message_id FROM handled_order ORDER BY id").fetchall()
        lost = conn.execute("SELECT message_id, stream_seq, found_at, repaired_at, repair_seq FROM audit_findings "
                            "WHERE kind = 'not_in_stream'").fetchall()
        dead = {r[0] for r in conn.execute("SELECT message_id FROM inbox_messages WHERE status = 'dead_lettered'")}
        states = dict(conn.execute("SELECT status, count(*) FROM inbox_messages GROUP BY status").fetchall())
    assert dead == poison and len(poison) == len(todo) // 1000, f"dead letters {len(dead)}, poison {len(poison)}"
    assert len(rows) == len({(a, n) for a, n, _ in rows}) == len(todo) - len(poison), states  # none lost, twice
    # What the broker acknowledged and lost comes back from the audit after later events of its
    # aggregate: those alone may be handled out of order, each one named by the audit.
    for message_id, seq, found, repaired, copy in lost:
        print(f"the broker lost {message_id}, acknowledged at stream sequence {seq}: found {found:%H:%M:%S.%f}, "
              f"published again {repaired and f'{repaired:%H:%M:%S.%f}'} at {copy}")
    repaired = {message_id for message_id, *_ in lost}
    last: dict[str, int] = {}
    for aggregate, n, message_id in rows:
        assert n > last.get(aggregate, -1) or message_id in repaired, \
            f"{aggregate} handled out of order: {n} after {last[aggregate]}\n{story(dsn, aggregate)}"
        last[aggregate] = max(n, last.get(aggregate, -1))
    # Each fault but the consumer's host cut off from every node: that one stops its handling for as
    # long as it lasts, by definition.
    slow = [f for f in faults if f["node"] != "consumer" and max(f["publishing"], f["handling"]) > (
        SPLIT_BOUND if "split" in f["fault"] else PAUSE_BOUND)]
    assert not (HOLD_BOUNDS and slow), f"a single node cut off stopped the flow for longer than its bound: {slow}"


def story(dsn: str, aggregate: str) -> str:
    """An aggregate's events as written, published, received and handled, for an order broken to be
    told apart: a stream order that differs from the write order is the relay's, a handling order that
    differs from the stream's is the consumer's."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT (o.payload->>'n')::int, o.seq, o.stream_seq, o.published_at, o.publish_attempts, i.received_at, "
            "i.processed_at, i.attempts, i.duplicates, h.id, h.pid FROM outbox_events o "
            "LEFT JOIN inbox_messages i ON i.message_id = o.id LEFT JOIN handled_order h ON h.message_id = o.id "
            "WHERE o.aggregate_id = %s ORDER BY o.seq", (aggregate,)).fetchall()
    head = "n | outbox seq | stream seq | published | publish attempts | received | processed | attempts | dups | handled # | pid"
    return "\n".join([head, *(" | ".join(f"{v:%H:%M:%S.%f}" if hasattr(v, "hour") else str(v) for v in row)
                               for row in rows)])
