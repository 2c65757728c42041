"""PostgreSQL failed over to a streaming standby (issue 47): the primary killed -9 while events are
written, relayed and handled, the standby promoted. The workers are given both servers in one DSN
with `target_session_attrs=read-write` and find the new primary themselves.

Synchronous replication: a commit returns once the standby has it, so nothing committed is lost:
every event written is published and handled once, and the audit finds nothing missing.
Asynchronous: the primary's last commits may never reach the standby. Here the standby's WAL
receiver is stopped for 2 s before the kill and killed with it (what its socket held goes too), so
they surely do not. Whatever of those had left for
the stream (the relay had published it) or had been acked (the consumer had handled it) is reported
by the audit: none silently."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psycopg
import pytest

from seamq.audit import Kind
from seamq.embedded.postgres import PostgresServer
from seamq.nats.stream_index import JsStreamIndex
from seamq.pg import migrate
from seamq.registry import load_registry

from helpers import freeze, scalar, wait_for
from helpers.audit import audit_once, by_kind
from helpers.consumer import CONSUMER, consuming
from helpers.failover import Standby, both, synchronous, wait_streaming
from helpers.relay import events_for, relay_running, unpublished

STREAM = "VIBESPRO_EVENTS"
BACK_BOUND = 60.0  # seconds from the kill to publishing and handling again, on a busy machine


@pytest.fixture
def servers(tmp_path):
    primary = PostgresServer(tmp_path / "primary")
    standby = Standby(tmp_path / "standby", primary)
    try:
        primary.start()
        standby.start()
        yield primary, standby
    finally:
        for server in (primary, standby):
            server.kill()
            server.remove_data()


class Writer:
    """Writes events in transactions of 10 through the two-server DSN, as an application would, and
    notes which commits returned (committed) and which failed at the commit (unknown)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.todo = events_for(200, 500, context="vibespro")
        self.committed: set = set()
        self.unknown: set = set()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        from seamq import outbox

        at = 0
        while not self.stop.is_set() and at < len(self.todo):
            batch = self.todo[at:at + 10]
            try:
                async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
                    while not self.stop.is_set() and at < len(self.todo):
                        batch = self.todo[at:at + 10]
                        await outbox.add_many_async(conn, batch)
                        try:
                            await conn.commit()
                        except psycopg.OperationalError:
                            self.unknown |= {e.id for e in batch}
                            at += 10
                            raise
                        self.committed |= {e.id for e in batch}
                        at += 10
                        await asyncio.sleep(0.04)
            except psycopg.OperationalError:  # the primary went: connect again (to whichever takes writes)
                await asyncio.sleep(0.5)


def _since(dsn: str, column: str, table: str, moment: float) -> float | None:
    """Seconds from `moment` to the first row whose `column` is after it."""
    value = scalar(dsn, f"SELECT extract(epoch FROM min({column})) FROM {table} WHERE {column} > to_timestamp(%s)",
                   (moment,))
    return None if value is None else float(value) - moment


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sync", [True, False], ids=["synchronous", "asynchronous"])
async def test_a_failover_to_the_standby(servers, nats_server, nc, topo, sync):
    primary, standby = servers
    synchronous(primary, sync)
    wait_streaming(primary, sync)
    primary.create_database("app")
    dsn = both(primary, standby, "app")
    await migrate.upgrade(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE side_effects (message_id uuid, aggregate_id text)")
    registry = load_registry("helpers.inprocess_handlers:REGISTRY")
    writer = Writer(dsn)
    async with relay_running(dsn, nats_server.url, topo), consuming(dsn, nats_server.url, topo, registry):
        writing = asyncio.create_task(writer.run())
        try:
            await wait_for(lambda: scalar(dsn, "SELECT count(*) FROM side_effects") >= 1000, timeout=120,
                           what="the first events handled")
            receiver = standby.receiver_pid()
            if not sync:  # what the primary commits now never reaches the standby
                freeze(receiver)
                await asyncio.sleep(2)
            killed = time.time()
            primary.kill()
            if not sync:  # and what its socket still holds goes with it
                os.kill(receiver, signal.SIGKILL)
            await asyncio.to_thread(standby.promote)
            promoted = time.time()
            await asyncio.sleep(5)
            writer.stop.set()
            await writing
            await wait_for(lambda: unpublished(dsn) == 0, timeout=180, interval=0.5, what="everything published")
            if sync:  # asynchronous: an inbox row committed in the lost seconds is gone, its message acked
                await wait_for(lambda: _settled(dsn), timeout=180, interval=0.5, what="everything handled")
            await wait_for(lambda: _all_acked(nc), timeout=180, interval=0.5, what="every message acked")
        finally:
            writer.stop.set()
            await writing
    published, handled = _since(dsn, "published_at", "outbox_events", killed), _since(
        dsn, "processed_at", "inbox_messages", killed)
    print(f"\n{'synchronous' if sync else 'asynchronous'}: the standby promoted {promoted - killed:.1f} s after "
          f"the primary was killed; publishing again after {published:.1f} s, handling after {handled:.1f} s; "
          f"{len(writer.committed)} committed, {len(writer.unknown)} unknown")
    assert published is not None and handled is not None and max(published, handled) <= BACK_BOUND

    with psycopg.connect(dsn) as conn:
        rows = {r[0] for r in conn.execute("SELECT id FROM outbox_events")}
        effects = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM side_effects").fetchone()
        finished = {r[0] for r in conn.execute("SELECT message_id FROM inbox_messages WHERE status = 'processed'")}
    assert effects[0] == effects[1], "a side effect written twice"
    _, last = await JsStreamIndex(nc).bounds(STREAM)
    stream = {m.message_id for m in await JsStreamIndex(nc).read(STREAM, 1, last)}
    audit = await audit_once(dsn, nats_server.url, topo, fresh=True)
    found = by_kind(audit["found"])
    if sync:
        assert writer.committed <= rows, f"{len(writer.committed - rows)} committed events lost"
        assert effects[1] == len(rows) and audit["missing"] == 0, (effects, found)
        return
    lost = writer.committed - rows
    gone = stream - rows  # events out in the stream whose rows the failover took
    unfinished = stream - finished
    print(f"lost with the primary: {len(lost)} committed events, {len(lost & stream)} of them published, "
          f"{len(gone)} events in the stream without their row, {len(unfinished)} acked and not in the inbox")
    assert lost, "the 2 s of commits the standby never received are gone"
    assert found.get(Kind.OUTBOX_ROW_GONE.value, set()) == gone and lost & stream <= gone
    assert found.get(Kind.NOT_IN_INBOX.value, set()) == unfinished
    assert audit["missing"] == len(gone) + len(unfinished), "nothing else is reported"


async def _all_acked(nc) -> bool:
    info = await nc.jetstream().consumer_info(STREAM, CONSUMER)
    return info.num_pending == 0 and info.num_ack_pending == 0


def _settled(dsn: str) -> bool:
    """Every row handled."""
    return scalar(dsn, "SELECT count(*) FROM outbox_events o WHERE NOT EXISTS (SELECT 1 FROM inbox_messages i "
                       "WHERE i.message_id = o.id AND i.status = 'processed')") == 0
