"""A 3-node JetStream cluster with R3 streams (SDS-047 §10): provisioning against it, and
relay and consumers through the loss of nodes, counted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import psycopg
import pytest

from seamq import outbox
from seamq.model import ErrorCode, SeamqError
from seamq.nats.connect import connect
from seamq.nats.provision import apply, plan
from seamq.settings import NatsSettings
from seamq.topology import load_topology

from helpers import SEAMQ, TESTS
from helpers import FAILOVER_TOPOLOGY, freeze, longest_pause, read_stream, scalar, wait_for, wait_while_moving
from helpers.relay import check_exactly_once_in_order, events_for, relay_running, unpublished

CONSUMER = "sea__from_vibespro"
TOPOLOGY = FAILOVER_TOPOLOGY


@pytest.fixture
async def cluster_nc(nats_cluster):
    client = await connect(NatsSettings(url=nats_cluster.url), name="seamq-test")
    yield client
    await client.close()


def topology_file(tmp_path: Path, text: str = TOPOLOGY) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    return path


async def test_provision_places_r3_and_refuses_more_replicas_than_servers(nats_server, nc, cluster_nc, tmp_path):
    path = topology_file(tmp_path)
    with pytest.raises(SeamqError) as single:
        await plan(nc.jetstream(), load_topology(path, replicas=3))
    assert single.value.code is ErrorCode.INVALID_TOPOLOGY and "one server, not a cluster" in single.value.message
    js = cluster_nc.jetstream()
    with pytest.raises(SeamqError) as five:
        await apply(js, load_topology(path, replicas=5))
    assert "a cluster of 3 servers" in five.value.message and "VIBESPRO_EVENTS" in five.value.message
    await apply(js, load_topology(path, replicas=1))
    scale_up = await plan(js, load_topology(path, replicas=3))
    diffs = {(c.name, f): (have, want) for c in scale_up for f, have, want in c.diffs}
    assert diffs[("VIBESPRO_EVENTS", "num_replicas")] == (1, 3)
    assert diffs[(CONSUMER, "num_replicas")] == (1, 3)
    await apply(js, load_topology(path, replicas=3))

    async def placed(info) -> bool:  # a leader and two current followers
        cluster = (await info).cluster
        return bool(cluster.leader) and len([p for p in cluster.replicas or [] if p.current]) == 2

    await wait_for(lambda: placed(js.stream_info("VIBESPRO_EVENTS")), what="the stream on three servers")
    await wait_for(lambda: placed(js.consumer_info("VIBESPRO_EVENTS", CONSUMER)), what="the consumer on three")
    assert {c.action for c in await plan(js, load_topology(path, replicas=3))} == {"unchanged"}


def test_provision_cli_says_what_to_change(nats_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    env.update(SEAMQ_NATS__URL=nats_server.url, SEAMQ_REPLICAS="3", SEAMQ_TOPOLOGY_FILE=str(topology_file(tmp_path)))
    result = subprocess.run([*SEAMQ, "provision", "--dry-run"], env=env, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error[INVALID_TOPOLOGY]:") and "Traceback" not in result.stderr
    assert "SEAMQ_REPLICAS" in result.stderr


async def stream_leader(js, cluster, stream: str = "VIBESPRO_EVENTS"):
    """The stream's leader node. Right after a heal the cluster may still be electing, and on a
    busy machine the answer can take longer than a request's 5 s: ask again, for a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            info = await js.stream_info(stream)
            if info.cluster and info.cluster.leader:
                return cluster.node(info.cluster.leader)
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
            pass
        assert time.monotonic() < deadline, "no stream leader for a minute"
        await asyncio.sleep(0.5)


class Fault:
    """kill -9 and start again; or freeze (SIGSTOP: the host hangs, its connections stay open and
    silent, which clients notice only by unanswered pings) and thaw."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def inject(self, node) -> None:
        node.kill() if self.kind == "kill" else freeze(node.proc.pid)

    def heal(self, node) -> None:
        node.start() if self.kind == "kill" else os.kill(node.proc.pid, signal.SIGCONT)


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
@pytest.mark.parametrize("fault", [Fault("kill"), Fault("freeze")], ids=["kill-9", "frozen"])
async def test_r3_cluster_loses_the_stream_leader_then_another_node_nothing_lost_or_doubled(
        dsn, nats_cluster, cluster_nc, tmp_path, fault):
    """20,000 events written while a relay and two consumer processes run; the stream leader's node
    fails and comes back, then another node: every event is in the stream once, in per-aggregate
    order, and every side effect happened once."""
    path = topology_file(tmp_path)
    await apply(cluster_nc.jetstream(), load_topology(path, replicas=3))
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE side_effects (message_id uuid, aggregate_id text)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    env.update(SEAMQ_DATABASE_URL=dsn, SEAMQ_NATS__URL=nats_cluster.url, SEAMQ_TOPOLOGY_FILE=str(path),
               SEAMQ_REPLICAS="3", PYTHONPATH=str(TESTS),
               SEAMQ_CONSUMER__REGISTRY="helpers.inprocess_handlers:REGISTRY", SEAMQ_CONSUMER__NAK_BASE="0.2")
    logs = [tmp_path / name for name in ("relay.log", "consumer-1.log", "consumer-2.log")]
    commands = [[*SEAMQ, "relay"], *[[*SEAMQ, "consume", "--consumer", CONSUMER]] * 2]
    workers = []
    for command, log in zip(commands, logs):
        with log.open("w") as out:  # the child writes its own copy
            workers.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
    events = events_for(200, 100, context="vibespro")
    handled = "SELECT count(*) FROM side_effects"

    async def produce():  # about 2,000 events/s, so the kills land while events still arrive
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for i in range(0, len(events), 200):
                await outbox.add_many_async(conn, events[i:i + 200])
                await conn.commit()
                await asyncio.sleep(0.1)

    async def fail_and_heal(node, after: int) -> float:
        await wait_for(lambda: scalar(dsn, handled) >= after, timeout=120, what=f"{after} handled")
        fault.inject(node)
        failed_at, before = time.monotonic(), scalar(dsn, handled)
        await wait_for(lambda: scalar(dsn, handled) > before + 200, timeout=120, what="progress without the node")
        stall = time.monotonic() - failed_at
        fault.heal(node)
        await asyncio.to_thread(nats_cluster.wait_for_jetstream, 60)
        return stall

    js = cluster_nc.jetstream()

    producer = asyncio.create_task(produce())
    try:
        first_leader = await stream_leader(js, nats_cluster)
        first = await fail_and_heal(first_leader, after=4000)
        now_leading = await stream_leader(js, nats_cluster)
        second = await fail_and_heal(now_leading if now_leading is not first_leader else nats_cluster.nodes[
            (nats_cluster.nodes.index(first_leader) + 1) % 3], after=10_000)
        await producer
        await wait_while_moving(lambda: len(events) - unpublished(dsn), len(events), still=120, what="publishing")
        try:
            await wait_while_moving(lambda: scalar(dsn, handled), 20_000, still=120, what="handling")
        except AssertionError as exc:  # what a stall leaves behind, to read when it happens on CI
            raise AssertionError(f"{exc}: {await stalled(dsn, js, workers, logs)}") from None

        async def settled():
            try:
                info = await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                return False  # slow to answer on a busy machine: ask again
            return info.num_pending == 0 and info.num_ack_pending == 0

        await wait_for(settled, timeout=60, what="every message acked")
    finally:
        producer.cancel()
        for w in workers:
            w.send_signal(signal.SIGTERM)
        exits = [w.wait(30) for w in workers]
    print(f"\nhandling resumed {first:.1f} s after the leader's {fault.kind}, {second:.1f} s after the second; longest "
          f"pause in publishing {longest_pause(dsn, 'published_at', 'outbox_events'):.1f} s, in handling "
          f"{longest_pause(dsn, 'processed_at', 'inbox_messages'):.1f} s")
    assert exits == [0, 0, 0]
    check_exactly_once_in_order(await read_stream(js, "VIBESPRO_EVENTS"), events)
    with psycopg.connect(dsn) as conn:
        total, distinct = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM side_effects").fetchone()
        dead = conn.execute("SELECT count(*) FROM inbox_messages WHERE status <> 'processed'").fetchone()[0]
    assert (total, distinct, dead) == (20_000, 20_000, 0)


async def stalled(dsn: str, js, workers: list, logs: list[Path]) -> str:
    """The side effects, the inbox by status, the consumer's numbers and each worker's last lines."""
    with psycopg.connect(dsn) as conn:
        statuses = conn.execute("SELECT status, count(*) FROM inbox_messages GROUP BY status").fetchall()
        effects = conn.execute("SELECT count(*) FROM side_effects").fetchone()[0]
    try:
        info = await js.consumer_info("VIBESPRO_EVENTS", CONSUMER)
        numbers = (f"pending {info.num_pending}, ack pending {info.num_ack_pending}, redelivered "
                   f"{info.num_redelivered}, delivered {info.delivered.stream_seq}, acked {info.ack_floor.stream_seq}")
    except Exception as exc:  # noqa: BLE001 (a cluster that does not answer is part of what is said)
        numbers = f"consumer info failed: {exc!r}"
    tails = "\n".join(f"--- {log.name} (exit {w.poll()}):\n" + "\n".join(log.read_text().splitlines()[-15:])
                      for w, log in zip(workers, logs))
    return (f"{effects} side effects; inbox {statuses}; "
            f"consumer: {numbers}\n{tails}")


@pytest.mark.timeout(600)
async def test_a_relay_with_hot_aggregates_keeps_each_in_order_while_stream_leaders_are_killed(
        dsn, nats_cluster, cluster_nc, tmp_path):
    """Twenty aggregates, so each claim carries tens of rows of each, sent one row of an aggregate at
    a time (seamq.nats.publisher): through two kills of the stream's leader, thousands of publishes
    unanswered and sent again, every event is in the stream once and each aggregate in order."""
    topology = load_topology(topology_file(tmp_path), replicas=3)
    js = cluster_nc.jetstream()
    await apply(js, topology)
    events = events_for(20, 1000, context="vibespro")
    published = lambda: scalar(dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL")  # noqa: E731

    async def produce():  # 5,000 events/s for 4 s: a backlog that the kills land in
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for i in range(0, len(events), 500):
                await outbox.add_many_async(conn, events[i:i + 500])
                await conn.commit()
                await asyncio.sleep(0.1)

    async with relay_running(dsn, nats_cluster.url, topology):
        producer = asyncio.create_task(produce())
        try:
            for after in (3000, 10_000):
                await wait_for(lambda a=after: published() >= a, timeout=120, what=f"{after} published")
                node = await stream_leader(js, nats_cluster)
                node.kill()
                more = min(published() + 1000, len(events))
                await wait_for(lambda m=more: published() >= m, timeout=120, what="publishing without the node")
                node.start()
                await asyncio.to_thread(nats_cluster.wait_for_jetstream, 60)
            await producer
            await wait_for(lambda: unpublished(dsn) == 0, timeout=180, what="everything published")
        finally:
            producer.cancel()
    check_exactly_once_in_order(await read_stream(js, "VIBESPRO_EVENTS"), events)
