"""`seamq audit` (issue 47): 100,000 events through the relay and a consumer; a clean audit finds
nothing; then 1,000 messages deleted from the stream at random, 1,000 inbox rows removed behind the
consumer's ack floor, and 100 outbox rows removed: the audit finds each of them and nothing else,
publishes the 1,000 again from their rows, and the consumer skips the copies it had handled."""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import time

import psycopg
import pytest

from seamq.audit import Kind
from seamq.nats.stream_index import JsStreamIndex
from seamq.pg.sql import query
from seamq.registry import load_registry
from seamq.settings import AuditSettings, NatsSettings, Settings
from seamq.wiring import auditor

from helpers import freeze, scalar, wait_for
from helpers.audit import audit_once, by_kind
from helpers.consumer import CONSUMER, consuming
from helpers.relay import events_for, relay_running, unpublished, write

N = 100_000
STREAM = "VIBESPRO_EVENTS"
SETTLE = 15.0  # longer than the rollback: a row is audited after its broker would have synced it


@pytest.mark.timeout(1200)
async def test_the_audit_finds_every_planted_loss_and_nothing_else(dsn, nats_server, nc, topo, monkeypatch):
    todo = events_for(500, N // 500, context="vibespro")
    await asyncio.to_thread(write, dsn, todo, 5000)
    async with relay_running(dsn, nats_server.url, topo):
        await wait_for(lambda: unpublished(dsn) == 0, timeout=600, interval=0.5, what="everything published")
    registry = load_registry("helpers.inprocess_handlers:NOTHING_REGISTRY")
    processed = f"SELECT count(*) FROM inbox_messages WHERE consumer = '{CONSUMER}' AND status = 'processed'"
    async with consuming(dsn, nats_server.url, topo, registry):
        await wait_for(lambda: scalar(dsn, processed) == N, timeout=600, interval=0.5, what="everything handled")
        await wait_for(lambda: _is(_ack_floor(nc), N), timeout=60, interval=0.5, what="every message acked")

    import seamq.pg.audit_repo

    queries = []
    monkeypatch.setattr(seamq.pg.audit_repo, "query", lambda name: queries.append(name) or query(name))
    clean = await audit_once(dsn, nats_server.url, topo, fresh=True)
    print(f"\nclean audit of {N}: {clean['checked']}, {clean['rounds']} rounds, {clean['cpu']:.1f} s CPU "
          f"({clean['cpu'] / (3 * N) * 1e6:.0f} us per row or message checked), {len(queries)} queries")
    assert clean["found"] == [] and clean["missing"] == 0
    checked = clean["checked"]
    assert (checked["published:vibespro"], checked["stream:vibespro"], checked[f"inbox:{CONSUMER}"]) == (N, N, N)

    rng = random.Random(47)
    ids = [e.id for e in todo]
    planted = rng.sample(range(N), 2100)
    from_stream, from_inbox, from_outbox = planted[:1000], planted[1000:2000], planted[2000:]
    js = nc.jetstream()
    # Where each message is (a row of a fast batch holds the batch's last sequence, not its own).
    seqs = {m.message_id: m.seq for m in await JsStreamIndex(nc).read(STREAM, 1, N)}
    for i in from_stream:
        assert await js.delete_msg(STREAM, seqs[ids[i]])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM inbox_messages WHERE consumer = %s AND message_id = ANY(%s)",
                     (CONSUMER, [ids[i] for i in from_inbox]))
        conn.execute("DELETE FROM outbox_events WHERE id = ANY(%s)", ([ids[i] for i in from_outbox],))

    planted_audit = await audit_once(dsn, nats_server.url, topo, fresh=True)
    found = by_kind(planted_audit["found"])
    print(f"audit after planting: {planted_audit['checked']}, {planted_audit['cpu']:.1f} s CPU")
    assert found.get(Kind.NOT_IN_STREAM.value) == {ids[i] for i in from_stream}
    assert found.get(Kind.NOT_IN_INBOX.value) == {ids[i] for i in from_inbox}
    assert found.get(Kind.OUTBOX_ROW_GONE.value) == {ids[i] for i in from_outbox}
    assert len(planted_audit["found"]) == 2100, "each once"
    assert planted_audit["repaired"] == 1000

    # The copies are in the stream; the consumer had handled the originals, and skips them.
    async with consuming(dsn, nats_server.url, topo, registry):
        await wait_for(lambda: _is(_ack_floor(nc), N + 1000), timeout=120, interval=0.5, what="the copies acked")
    assert scalar(dsn, processed) == N - 1000
    again = await audit_once(dsn, nats_server.url, topo, fresh=True)
    assert again["found"] == [] and again["repaired"] == 0, "nothing new, nothing published twice"
    assert again["missing"] == 1000 + 100, "still missing: the inbox rows and outbox rows removed (not repairable)"


async def _ack_floor(nc) -> int:
    return (await nc.jetstream().consumer_info(STREAM, CONSUMER)).ack_floor.stream_seq


async def _is(value, wanted: int) -> bool:
    return await value >= wanted


@pytest.mark.timeout(1200)
async def test_a_store_rolled_back_by_ten_seconds_is_found_repaired_and_nothing_is_lost_or_doubled(
        dsn, nats_server, nc, topo):
    """What a power loss does under JetStream's default fsync (every 2 minutes): the store goes back to
    what the disk held seconds earlier, and acknowledged writes are gone. The store is copied while
    the server is stopped (SIGSTOP: the copy is what a disk held at that instant), events flow 10 s
    more, the server is killed and started on the copy. The relay had marked those 10 s published."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE side_effects (message_id uuid, aggregate_id text)")
    todo = events_for(200, 100, context="vibespro")
    written = 0
    stop_writing = asyncio.Event()

    async def produce():  # 250 events/s
        nonlocal written
        while written < len(todo) and not stop_writing.is_set():
            await asyncio.to_thread(write, dsn, todo[written:written + 25], 25)
            written += 25
            await asyncio.sleep(0.1)

    settings = Settings(database_url=dsn, nats=NatsSettings(url=nats_server.url),
                        audit=AuditSettings(settle=SETTLE, interval=1.0))
    registry = load_registry("helpers.inprocess_handlers:REGISTRY")
    store = nats_server.data_dir / "jetstream"
    snapshot = nats_server.data_dir.parent / "snapshot"
    stop_audit = asyncio.Event()
    async with relay_running(dsn, nats_server.url, topo), consuming(dsn, nats_server.url, topo, registry), \
            auditor(settings, topo) as auditing:
        audit_task = asyncio.create_task(auditing.run(stop_audit))
        producer = asyncio.create_task(produce())
        try:
            await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM side_effects") >= 1000, timeout=120,
                           what="the first events handled")
            freeze(nats_server.proc.pid)
            try:
                shutil.copytree(store, snapshot)
            finally:
                nats_server.proc.send_signal(signal.SIGCONT)
            taken = time.time()
            await asyncio.sleep(10)
            nats_server.kill()
            shutil.rmtree(store)
            shutil.copytree(snapshot, store)
            nats_server.start()
            restored = time.time()
            # What the relay had marked published before the server came back: a mark committed just
            # after the kill is of a message acked before it (nothing answers in between).
            with psycopg.connect(dsn) as conn:
                published = {r[0] for r in conn.execute(
                    "SELECT id FROM outbox_events WHERE published_at IS NOT NULL AND published_at < "
                    "to_timestamp(%s)", (restored,)).fetchall()}
            index = JsStreamIndex(nc)
            _, last = await wait_for(lambda: _answered(index.bounds(STREAM)), timeout=60, what="JetStream back")
            # Originals only: the audit may already have published copies of the first ones it found
            # (CI read the stream 5 s after the restart, after 150 copies).
            stored = {m.message_id for m in await index.read(STREAM, 1, last) if not m.copy}
            lost = published - stored
            print(f"\nrolled back: {len(lost)} acknowledged events lost (the copy {restored - taken:.1f} s old)")
            assert len(lost) > 500, "the rollback lost what was published in those 10 s"

            async def repaired() -> bool:
                with psycopg.connect(dsn) as conn:
                    return lost <= {r[0] for r in conn.execute("SELECT message_id FROM audit_findings WHERE kind = "
                                                               "'not_in_stream' AND repaired_at IS NOT NULL")}
            await wait_for(repaired, timeout=SETTLE + 120, interval=0.5, what="every lost event repaired")
            took = time.time() - restored
            print(f"every lost event found and published again {took:.1f} s after the restart")
            stop_writing.set()
            await producer
            await wait_for(lambda: unpublished(dsn) == 0, timeout=120, what="everything published")
            await wait_for(lambda: scalar(dsn, "SELECT count(DISTINCT message_id) FROM side_effects") >= written,
                           timeout=180, interval=0.5, what="everything handled")
        finally:
            stop_writing.set()
            stop_audit.set()
            await audit_task
    # What was lost, exactly: marked published (only after the server's ack) yet no original in the
    # stream. The set taken at the restart missed marks committed after it (CI: 7 of 2,075).
    _, last = await index.bounds(STREAM)
    originals = {m.message_id for m in await index.read(STREAM, 1, last) if not m.copy}
    with psycopg.connect(dsn) as conn:
        lost = {r[0] for r in conn.execute(
            "SELECT id FROM outbox_events WHERE published_at IS NOT NULL").fetchall()} - originals
        found = {r[0] for r in conn.execute("SELECT message_id FROM audit_findings WHERE kind = 'not_in_stream'")}
        other = conn.execute("SELECT kind, count(*) FROM audit_findings WHERE kind <> 'not_in_stream' "
                             "GROUP BY kind").fetchall()
        handled = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM side_effects").fetchone()
        ids = {r[0] for r in conn.execute("SELECT id FROM outbox_events").fetchall()}
        effects = {r[0] for r in conn.execute("SELECT message_id FROM side_effects").fetchall()}
    assert found == lost, f"found {len(found)}: {len(found - lost)} not lost, {len(lost - found)} lost not found"
    assert other == [], other
    assert handled == (written, written) and effects == ids, "none lost, none handled twice"
    assert took <= SETTLE + 30, f"found and repaired {took:.0f} s after the restart"


async def _answered(call):
    """What a JetStream call answers, or None while the server is not serving it yet."""
    try:
        return await call
    except Exception:
        return None
