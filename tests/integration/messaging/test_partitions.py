"""Per-aggregate order across consumer processes: partitioned consumers (seamq.nats.partitions)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import nats
import psycopg
import pytest

from seamq import outbox
from seamq.model import Event, message_headers, traceparent_for
from seamq.nats import jsapi
from seamq.nats.members import members
from seamq.nats.partitions import GROUP, Partition, counted
from seamq.nats.pull import PullSource
from seamq.nats.provision import apply
from seamq.wiring import run_relay
from seamq.settings import NatsSettings, RelaySettings, Settings
from seamq.topology import load_topology

from helpers import SEAMQ, TESTS
from helpers import scalar, wait_for

CONSUMER = "sea__from_vibespro"
PARTITIONED = """
contexts:
  sea: {}
  vibespro:
    stream: {duplicate_window: 1s}
consumers:
  sea__from_vibespro: {ack_wait: 3s, max_deliver: 20, max_ack_pending: 50, partitions: 6, pinned_ttl: 3s}
"""


def test_a_look_counts_only_what_the_server_had_delivered_when_it_looked():
    held = [SimpleNamespace(consumer_seq=seq) for seq in (5, 6, 7)]
    assert counted([], delivered=0) == 0
    assert counted(held[:2], delivered=6) == 2
    assert counted(held, delivered=6) == 2  # 7 came after the look: not in its count


async def _old_owner_and_a_takeover(nc, nats_server, old_busy: dict):
    """A partition consumer; an old owner (its own connection) that took messages 1-3 and keeps them
    past ack_wait; then a Partition that the server pins once the old owner stops pulling."""
    js = nc.jetstream()
    await js.add_stream(name="HANDOVER", subjects=["handover.>"])
    await jsapi.call(nc, "CONSUMER.CREATE.HANDOVER.part", {"stream_name": "HANDOVER", "config": {
        "durable_name": "part", "deliver_policy": "all", "ack_policy": "explicit", "ack_wait": 1_000_000_000,
        "max_deliver": -1, "priority_groups": [GROUP], "priority_policy": "pinned_client",
        "priority_timeout": 1_000_000_000}})
    for n in range(1, 5):
        await js.publish(f"handover.{n}", str(n).encode())
    other = await nats.connect(nats_server.url)
    old = await PullSource(other, "HANDOVER", "part", buffer=3, group=GROUP).start()
    got = await old.fetch(3, timeout=10)
    assert [m.metadata.sequence.stream for m in got] == [1, 2, 3]

    async def others_busy(durable: str) -> bool:
        return old_busy["busy"]

    new = await Partition(nc, "HANDOVER", "part", buffer=10, ack_wait=1.0, pinned_ttl=1.0, arrived=asyncio.Event(),
                          others_busy=others_busy).start()
    return other, got, new


async def _take(partition, until, timeout: float = 30.0) -> list[int]:
    """Drive the partition as the consumer does until `until(taken, partition)`; the stream sequences taken."""
    taken: list[int] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while not until(taken, partition) and asyncio.get_running_loop().time() < deadline:
        for delivery in await partition.take(10):
            taken.append(delivery.seq)
            await delivery.ack()
        await partition.pull.top_up()
        await asyncio.sleep(0.05)
    return taken


async def test_a_takeover_waits_out_a_message_acked_by_its_old_owner_and_keeps_the_order(nc, nats_server):
    """The old owner, alive and slow, sends message 3 back for later and acks message 1 after it came
    to the new owner. Counting alone then sees what it holds (1, 2, 4) as every pending message (2, 3,
    4): it handed on 4 before 3 (the partitions soak's order violation), or, when 3 came back first,
    held 4 messages against 3 pending and waited forever (the soak's stall)."""
    old_busy = {"busy": True}
    other, (m1, _, m3), new = await _old_owner_and_a_takeover(nc, nats_server, old_busy)
    try:
        await m3.nak(delay=5)  # a retry: it comes back in 5 s, to whoever is pinned then
        await asyncio.sleep(2.5)  # m1 and m2 expire, the old owner's pin too
        assert await _take(new, lambda taken, p: 1 in p.held) == []  # m1 came to the new owner: held
        await m1.ack()  # the old owner's late ack: m1 is no longer pending, though held
        await other.flush()
        old_busy["busy"] = False
        assert await _take(new, lambda taken, p: len(taken) >= 3) == [2, 3, 4]
        assert (await new._info())["num_ack_pending"] == 0
        assert new.out == 0  # what it gave back while it held it was never out
    finally:
        await new.close(unpin=False)
        await other.close()


async def test_a_takeover_waits_while_another_process_has_messages_out(nc, nats_server):
    old_busy = {"busy": True}
    other, _, new = await _old_owner_and_a_takeover(nc, nats_server, old_busy)
    try:
        await asyncio.sleep(2.5)  # 1, 2, 3 expire: they come to the new owner with 4
        assert await _take(new, lambda taken, p: len(p.held) == 4) == []
        assert await _take(new, lambda taken, p: bool(taken), timeout=3) == []  # all in hand, but 'busy'
        old_busy["busy"] = False
        assert await _take(new, lambda taken, p: len(taken) >= 4) == [1, 2, 3, 4]
    finally:
        await new.close(unpin=False)
        await other.close()


def test_partition_filters_split_the_buckets_and_keep_unbucketed_events():
    topology = load_topology_text(PARTITIONED)
    spec = topology.consumer(CONSUMER)
    assert spec.durables() == [f"{CONSUMER}-p{k}" for k in range(6)]
    filters = [spec.partition_filters(k) for k in range(6)]
    assert filters[0][0] == "vibespro.event.*.*"  # published without a bucket: partition 0, nothing lost
    buckets = sorted(int(f.rsplit(".b", 1)[1]) for fs in filters for f in fs if ".b" in f)
    assert buckets == list(range(128))  # each bucket in exactly one partition
    assert topology.event_subject("vibespro", "vibe_created", 1, 17) == "vibespro.event.vibe_created.v1.b17"
    assert topology.event_subject("sea", "order_placed", 1, 17) == "sea.event.order_placed.v1"  # not partitioned


def load_topology_text(text: str):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        return load_topology(f.name)
    finally:
        Path(f.name).unlink()


async def test_an_unpartitioned_consumer_is_not_replaced_silently(nc, tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text(PARTITIONED.replace(", partitions: 6, pinned_ttl: 3s", ""))
    js = nc.jetstream()
    await apply(js, load_topology(plain))
    with pytest.raises(Exception) as refused:
        await apply(js, load_topology_text(PARTITIONED))
    assert "--migrate-partitions" in str(refused.value)
    assert [c.name for c in await js.consumers_info("VIBESPRO_EVENTS")] == [CONSUMER]
    await js.publish("vibespro.event.vibe_created.v1", b"{}")
    with pytest.raises(Exception) as unbucketed:  # an unhandled event without a bucket: handle it first
        await apply(js, load_topology_text(PARTITIONED), migrate=True)
    assert "without a partition bucket" in str(unbucketed.value)

    old = await js.pull_subscribe_bind(CONSUMER, "VIBESPRO_EVENTS")
    for msg in await old.fetch(1, timeout=2):
        await msg.ack_sync()  # handled: the migration may go on
    for b in (3, 4, 9):
        await js.publish(f"vibespro.event.vibe_created.v1.b{b}", b"{}")
    changes = await apply(js, load_topology_text(PARTITIONED), migrate=True)
    assert {c.name for c in changes} >= {f"{CONSUMER}-p{k}" for k in range(6)}
    infos = {c.name: c for c in await js.consumers_info("VIBESPRO_EVENTS")}
    assert CONSUMER not in infos and len(infos) == 6  # the old one is gone
    assert {name: i.num_pending for name, i in infos.items() if i.num_pending} == {
        f"{CONSUMER}-p3": 2, f"{CONSUMER}-p4": 1}  # b3, b9 -> p3; b4 -> p4; nothing before the old ack floor
    again = await apply(js, load_topology_text(PARTITIONED))
    assert {c.action for c in again if c.kind == "consumer"} == {"unchanged"}


async def members_answering(nc, count: int) -> bool:
    return len(await members(nc, CONSUMER, wait=1.0)) == count


async def provisioned_with_order_table(nc, dsn, tmp_path, text: str):
    """The topology file, provisioned, and the table inprocess_handlers.record_order writes to."""
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    topology = load_topology(path)
    await apply(nc.jetstream(), topology)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE handled_order (id bigserial PRIMARY KEY, message_id uuid, aggregate_id text, "
                     "n int, pid int)")
    return path, topology


@pytest.mark.timeout(900)  # its own limit: a long run on a busy machine is no hang
async def test_three_processes_keep_each_aggregates_order_through_failures_and_a_kill_9(
        dsn, nats_server, nc, tmp_path, service_env):
    """20,000 events over 200 aggregates, 3 `seamq consume` processes on one 6-partition consumer,
    about 1% of first deliveries fail, one process is killed -9 mid-run."""
    topology_file, topology = await provisioned_with_order_table(nc, dsn, tmp_path, PARTITIONED)
    js = nc.jetstream()
    events = [Event(context="vibespro", aggregate_type="vibe", aggregate_id=f"a-{a}", event_type="vibe_created",
                    payload={"n": n}) for n in range(100) for a in range(200)]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for i in range(0, len(events), 2000):
            await outbox.add_many_async(conn, events[i:i + 2000])
            await conn.commit()
    env = dict(service_env, PYTHONPATH=str(TESTS), SEAMQ_TOPOLOGY_FILE=str(topology_file),
               SEAMQ_CONSUMER__REGISTRY="helpers.inprocess_handlers:ORDER_REGISTRY", SEAMQ_CONSUMER__NAK_BASE="0.1",
               SEAMQ_CONSUMER__NAK_MAX="0.5")
    argv = [*SEAMQ, "consume", "--consumer", CONSUMER]
    logs = [open(tmp_path / f"consumer-{i}.log", "wb") for i in range(3)]  # kept by pytest: each handover said
    workers = [subprocess.Popen(argv, env={**env, "SEAMQ_LOG_LEVEL": "info"}, stdout=log, stderr=subprocess.STDOUT)
               for log in logs]
    handled = "SELECT count(*) FROM handled_order"
    killed = relay = None
    stop = asyncio.Event()
    try:
        # The events flow once all three are up: on a busy machine a process can take many seconds
        # to start, and two would handle everything before it came.
        await wait_for(lambda: members_answering(nc, 3), timeout=240, what="three processes up")
        settings = Settings(database_url=dsn, nats=NatsSettings(url=nats_server.url), relay=RelaySettings())
        relay = asyncio.create_task(run_relay(settings, topology, stop))
        await wait_for(lambda: scalar(dsn, "SELECT count(DISTINCT pid) FROM handled_order") == 3, timeout=120,
                       what="all three processes handling")
        await wait_for(lambda: scalar(dsn, handled) > 6000, timeout=60, what="progress")
        victim = scalar(dsn, "SELECT pid FROM handled_order ORDER BY id DESC LIMIT 1")
        killed = next(w for w in workers if w.pid == victim)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        at_kill = scalar(dsn, handled)
        assert at_kill < 20_000
        await wait_for(lambda: scalar(dsn, handled) >= 20_000, timeout=240, what="everything handled")

        async def settled():
            for k in range(6):
                info = await js.consumer_info("VIBESPRO_EVENTS", f"{CONSUMER}-p{k}")
                if info.num_pending or info.num_ack_pending:
                    return False
            return True

        await wait_for(settled, timeout=60, what="every partition acked")
    finally:
        stop.set()
        if relay is not None:
            await asyncio.wait_for(relay, 30)
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        exits = [w.wait(30) for w in workers if w is not killed]
        for log in logs:
            log.close()
    assert exits == [0, 0]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT aggregate_id, n, pid FROM handled_order ORDER BY id").fetchall()
        distinct = conn.execute("SELECT count(DISTINCT message_id) FROM handled_order").fetchone()[0]
        subjects = conn.execute("SELECT count(*) FROM outbox_events WHERE published_at IS NULL").fetchone()[0]
    assert subjects == 0
    assert (len(rows), distinct) == (20_000, 20_000)  # none lost, none twice
    order: dict[str, list[int]] = {}
    for aggregate, n, _ in rows:
        order.setdefault(aggregate, []).append(n)
    assert len(order) == 200
    out_of_order = [a for a, ns in order.items() if ns != list(range(100))]
    assert out_of_order == []
    # The ~1% that failed on a first delivery that reached the handler (200 at most: some were held
    # then): each has its failed attempt in its history, and a kill's redelivery costs no attempt.
    failed = scalar(dsn, "SELECT count(DISTINCT message_id) FROM inbox_attempts")
    assert 100 < failed <= 200
    assert scalar(dsn, "SELECT count(*) FROM inbox_messages WHERE attempts > 1") == failed
    taken_over = {a for a, n, pid in rows if pid == victim} & {a for a, n, pid in rows[at_kill:] if pid != victim}
    assert taken_over  # the killed process's aggregates went on elsewhere


def test_the_bucket_is_routing_not_identity():
    """Handlers see the event subject, DLQ subjects have no bucket, the pipeline reads type and version."""
    from seamq import dead_letter
    from seamq.envelope import parse_message
    from seamq.pipeline.source import _row

    spec = load_topology_text(PARTITIONED).consumer(CONSUMER)
    event = Event(context="vibespro", aggregate_type="vibe", aggregate_id="a-1", event_type="vibe_created",
                  event_version=2, payload={})
    subject = "vibespro.event.vibe_created.v2.b17"
    envelope = parse_message(subject, message_headers(event, traceparent_for(event.id)), b"{}", 1)
    assert (envelope.subject, envelope.event_type, envelope.event_version) == (
        "vibespro.event.vibe_created.v2", "vibe_created", 2)
    assert dead_letter.subject(spec, subject) == "sea.dlq.vibespro.vibe_created.v2"

    class Msg:
        headers, data = {"Nats-Msg-Id": str(event.id)}, b"{}"

    Msg.subject = subject
    assert _row(Msg, 5, None)[1:5] == (subject, "vibespro", "vibe_created", 2)


async def test_a_clean_stop_hands_its_partitions_over_at_once(dsn, nats_server, nc, tmp_path):
    """A stopping process acks what it has and unpins: the next one starts without waiting out pinned_ttl."""
    from seamq.registry import load_registry
    from seamq.wiring import run_consumer
    from seamq.settings import ConsumerSettings

    _, topology = await provisioned_with_order_table(
        nc, dsn, tmp_path, PARTITIONED.replace("pinned_ttl: 3s", "pinned_ttl: 60s"))
    js = nc.jetstream()
    settings = Settings(database_url=dsn, nats=NatsSettings(url=nats_server.url),
                        consumer=ConsumerSettings(registry="helpers.inprocess_handlers:ORDER_REGISTRY"))
    registry = load_registry("helpers.inprocess_handlers:ORDER_REGISTRY")

    async def publish(first: int) -> None:
        for n in range(first, first + 60):
            event = Event(context="vibespro", aggregate_type="vibe", aggregate_id=f"a-{n % 12}",
                          event_type="vibe_created", payload={"n": n})
            await js.publish(topology.event_subject("vibespro", "vibe_created", 1, n % 12), b'{"n": %d}' % n,
                             headers=message_headers(event, traceparent_for(event.id)))

    await publish(0)
    stop = asyncio.Event()
    first = asyncio.create_task(run_consumer(settings, topology, CONSUMER, stop, registry))
    await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM handled_order") == 60, timeout=30, what="first 60")

    [alone] = await members(nc, CONSUMER, wait=1.0)  # the one process holds every partition, and says so
    assert sorted(alone["holds"]) == sorted(topology.consumer(CONSUMER).durables()) and alone["process"].endswith(
        f"pid {os.getpid()}")
    from seamq.console.overview import Overview  # the console's overview says the same, per partition
    from seamq.doors import OverviewReader

    reader = OverviewReader(None)  # no database here: its part is said as an error
    reader.attach(nc)
    overview = Overview(reader, topology)
    await overview.refresh_holders()
    shot = await overview.snapshot()
    [row] = [c for c in shot.consumers if c["consumer"] == CONSUMER]
    assert {d["name"]: d["held_by"] for d in row["durables"]} == {d: alone["process"] for d in alone["holds"]}
    stop.set()
    await asyncio.wait_for(first, 30)
    await publish(60)
    stop = asyncio.Event()
    second = asyncio.create_task(run_consumer(settings, topology, CONSUMER, stop, registry))
    try:  # well inside pinned_ttl (60 s): only an unpin lets the second process in this soon
        await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM handled_order") == 120, timeout=20,
                       what="the second process handling, before pinned_ttl")
    finally:
        stop.set()
        await asyncio.wait_for(second, 30)
