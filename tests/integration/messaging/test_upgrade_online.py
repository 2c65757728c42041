"""`seamq db upgrade` to partitioned tables (migration 0013) on an install with rows, while writers
of the previous version go on, cut short by kill -9 in the middle of an index build and run again:
every row written before and during it is there once, and the upgrade said how far it was."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import uuid

import psycopg

from helpers import SEAMQ
from helpers import scalar, wait_for
from seamq.ids import uuid7
from seamq.pg import migrate

HISTORY = 50_000


def load_history(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload, "
                     "published_at, stream_seq) SELECT gen_random_uuid(), 'sea', 'order', 'o-' || g %% 100, "
                     "'order_placed', '{}', now(), g FROM generate_series(1, %s) g", (HISTORY,))
        conn.execute("INSERT INTO inbox_messages (consumer, message_id, subject, status, processed_at) "
                     "SELECT 'billing', gen_random_uuid(), 's', 'processed', now() FROM generate_series(1, %s)",
                     (HISTORY,))


class PreviousVersionWriters:
    """What producers, relays and consumers of the version before write: no `part`."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.stop, self.errors = dsn, threading.Event(), []
        self.events: list[uuid.UUID] = []
        self.messages: list[uuid.UUID] = []
        self.threads = [threading.Thread(target=self._produce), threading.Thread(target=self._receive)]

    def __enter__(self) -> PreviousVersionWriters:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _loop(self, write, into: list) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                new = uuid7()
                try:
                    write(conn, new)
                    into.append(new)
                except psycopg.Error as exc:  # counted: a write refused is no write lost
                    self.errors.append(str(exc))

    def _produce(self) -> None:
        def write(conn, new):
            conn.execute("INSERT INTO outbox_events (id, context, aggregate_type, aggregate_id, event_type, payload) "
                         "VALUES (%s, 'sea', 'order', 'o-1', 'order_placed', '{}')", (new,))
            conn.execute("UPDATE outbox_events SET published_at = now() WHERE id = %s", (new,))  # the relay's mark
        self._loop(write, self.events)

    def _receive(self) -> None:
        def write(conn, new):
            conn.execute("INSERT INTO inbox_messages (consumer, message_id, subject) VALUES ('billing', %s, 's') "
                         "ON CONFLICT DO NOTHING", (new,))
        self._loop(write, self.messages)


async def test_an_upgrade_killed_mid_build_and_run_again_keeps_every_row_written_before_and_during_it(empty_dsn):
    await migrate.upgrade(empty_dsn, until=12)
    load_history(empty_dsn)
    env = {"SEAMQ_DATABASE_URL": empty_dsn, "PATH": os.environ["PATH"]}
    with PreviousVersionWriters(empty_dsn) as writers:
        await wait_for(lambda: len(writers.events) > 50 and len(writers.messages) > 50, what="writers going")
        # A snapshot older than the index build keeps it waiting (a concurrent build waits for
        # older snapshots, whatever they read): the kill lands in the middle of it, index half-made.
        with psycopg.connect(empty_dsn) as blocker:
            blocker.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            blocker.execute("SELECT count(*) FROM seamq_migrations")
            first = subprocess.Popen([*SEAMQ, "db", "upgrade"], env=env, stdout=subprocess.PIPE, text=True)
            # Waited for by phase, not by the row alone: the row appears before the build's first
            # transaction commits the index to the catalog, and a kill then leaves nothing half-made.
            await wait_for(lambda: scalar(empty_dsn, "SELECT count(*) FROM pg_stat_progress_create_index"
                                          " WHERE command = 'CREATE INDEX CONCURRENTLY'"
                                          " AND phase = 'waiting for old snapshots'") == 1,
                           timeout=120, what="the key's build waiting on the older snapshot")
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            # The server's side of the cut-off session ends too (as a lost client's would).
            scalar(empty_dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_progress_create_index")
            blocker.rollback()
        assert scalar(empty_dsn, "SELECT count(*) FROM pg_index WHERE NOT indisvalid") == 1, "a half-made index"
        assert scalar(empty_dsn, "SELECT count(*) FROM seamq_migrations WHERE version = 13") == 0
        again = await asyncio.to_thread(subprocess.run, [*SEAMQ, "db", "upgrade"], env=env, capture_output=True,
                                        text=True, timeout=300)
        assert again.returncode == 0, again.stderr
        assert "outbox_events: the new key" in again.stdout and "applied 0013_partitioned_by_id_time" in again.stdout
        await wait_for(lambda: len(writers.events) > 100 + len(writers.errors), what="writes after the upgrade")
    assert scalar(empty_dsn, "SELECT count(*) FROM pg_index WHERE NOT indisvalid") == 0
    assert writers.errors == [], writers.errors[:3]  # producers of the version before keep working until T
    with psycopg.connect(empty_dsn) as conn:
        for table, key, written in (("outbox_events", "id", writers.events),
                                    ("inbox_messages", "message_id", writers.messages)):
            counts = dict(conn.execute(f"SELECT {key}, count(*) FROM {table} WHERE {key} = ANY(%s) GROUP BY 1",
                                       (written,)).fetchall())
            assert len(counts) == len(written) and set(counts.values()) == {1}, f"{table}: lost or twice"
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == HISTORY + len(written)
            assert conn.execute(f"SELECT count(*) FROM {table}_legacy").fetchone()[0] == HISTORY + len(written)
        assert conn.execute("SELECT count(*) FROM outbox_events WHERE published_at IS NULL").fetchone()[0] == 0
